"""A real S3 API on loopback (moto's server behind a fault-injecting proxy) for the storage
tests: started once per session, its dummy credentials and endpoint set in the environment only
while it runs (subprocesses of a test inherit them)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("moto.server", reason="moto's server mode is not installed (pip install 'moto[server]')")
pytest.importorskip("obstore", reason="obstore is not installed (pip install 'speech-dataprep[store]')")

from dataprep.testing_store import LoopbackS3  # noqa: E402
from manifests import storage  # noqa: E402

#: fast retries for the tests: a fault costs milliseconds, a give-up under a second
TEST_ENV = {"DATAPREP_STORE_ATTEMPTS": "4", "DATAPREP_STORE_BACKOFF_S": "0.01", "DATAPREP_STORE_TIMEOUT_S": "2"}


@pytest.fixture(scope="session")
def loopback_s3() -> Iterator[LoopbackS3]:
    server = LoopbackS3()
    env = {**server.env(), **TEST_ENV}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage.reset_clients()
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        storage.reset_clients()
        server.close()


@pytest.fixture()
def s3(loopback_s3: LoopbackS3, request: pytest.FixtureRequest) -> Iterator[LoopbackS3]:
    """The loopback store with no fault rules and its counters at zero; ``s3.bucket`` is a
    fresh bucket URL for this test (``s3://t-<test name>``)."""
    loopback_s3.clear_faults()
    bucket = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50].strip("-")
    loopback_s3.bucket = loopback_s3.create_bucket(bucket)  # type: ignore[attr-defined]
    storage.reset_clients()
    loopback_s3.reset_counts()
    yield loopback_s3
    loopback_s3.clear_faults()


@pytest.fixture(scope="session")
def tiny_spm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 200-piece sentencepiece model (local: a tokenizer is read from disk)."""
    from dataprep.testing import sample_corpus
    from dataprep.tokenize import train_model

    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    train_model(sample_corpus(2000)[1], path, vocab_size=200)
    return str(path)
