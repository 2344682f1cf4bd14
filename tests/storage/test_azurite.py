"""``az://`` through the same functions as ``s3://``, against Azurite (Azure's blob emulator, from
npm: ``npm install azurite``) on loopback; skipped where ``azurite-blob`` is not on the PATH
(or in ``$AZURITE_BLOB``) or azure-storage-blob (to create the container) is missing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("obstore", reason="obstore is not installed")
blob = pytest.importorskip("azure.storage.blob", reason="azure-storage-blob is not installed")
AZURITE = os.environ.get("AZURITE_BLOB") or shutil.which("azurite-blob")
pytestmark = pytest.mark.skipif(AZURITE is None, reason="azurite-blob (npm install azurite) is not on the PATH")

from manifests import storage  # noqa: E402
from tests.storage._round_trip import check_reads_writes_and_listing  # noqa: E402

#: Azurite's well-known development account (public, in Azure's docs)
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--silent",
                             "--skipApiVersionCheck", "--location", str(tmp_path_factory.mktemp("azurite"))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"
    conn = f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};BlobEndpoint={endpoint};"
    for _ in range(200):  # until it listens (the blob client's own retries back off for seconds)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    blob.BlobServiceClient.from_connection_string(conn).create_container("corpus")
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage.reset_clients()
    try:
        yield "az://corpus"
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        storage.reset_clients()
        proc.kill()
        proc.wait()


def test_reads_writes_and_listing_of_az_urls(azurite: str, tmp_path: Path) -> None:
    check_reads_writes_and_listing(azurite, tmp_path)
