"""What every store must do through :mod:`manifests.storage`, checked the same way for ``az://``
(Azurite) and ``gs://`` (obstore's GCS client against the loopback S3)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from manifests import storage


def check_reads_writes_and_listing(root: str, tmp_path: Path) -> None:
    """A multipart write, its size, two ranges of it, an upload, a listing, an absent object."""
    data = os.urandom(6 << 20)
    with storage.open_output(f"{root}/big.bin", chunk=5 << 20) as out:  # a multipart (block) upload
        out.write(data)
    assert storage.stat(f"{root}/big.bin").size == len(data)
    assert storage.read_ranges(f"{root}/big.bin", [(7, 100), (5 << 20, 9)], gap=0) == [data[7:107], data[5 << 20:(5 << 20) + 9]]
    (tmp_path / "m.jsonl").write_text('{"a": 1}\n')
    storage.upload(tmp_path / "m.jsonl", f"{root}/dir/m.jsonl")
    assert [u for u, _ in storage.list_prefix(f"{root}/dir/")] == [f"{root}/dir/m.jsonl"]
    assert not storage.exists(f"{root}/dir/absent.jsonl")
    with pytest.raises(storage.StoreError, match=rf"^{re.escape(root)}/absent\.bin: no such object$"):
        storage.read_bytes(f"{root}/absent.bin")
