"""Atomic writes, metadata and content hashes of compiled manifests."""

from __future__ import annotations

import polars as pl
import pytest

from manifests.errors import ManifestError
from manifests.io import atomic_path, read_manifest, read_metadata, write_manifest
from manifests.schema import MANIFEST_COLUMNS, SCHEMA_VERSION


def _frame(n: int = 5) -> pl.DataFrame:
    return pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": [1.0 + i for i in range(n)],
                         "text": ["a b"] * n, "num_tokens": [3] * n, "origin": [f"x.jsonl:{i + 1}" for i in range(n)]})


def test_roundtrip_schema_and_metadata(tmp_path) -> None:
    path = tmp_path / "m.parquet"
    h = write_manifest(_frame(), path, {"k": 1})
    df = read_manifest(path)
    assert tuple(df.columns) == MANIFEST_COLUMNS
    meta = read_metadata(path)
    assert meta["schema_version"] == SCHEMA_VERSION and meta["content_hash"] == h
    assert meta["provenance"] == {"k": 1} and meta["kind"] == "manifest"


def test_hash_depends_on_data_only(tmp_path) -> None:
    a = write_manifest(_frame(), tmp_path / "a.parquet", {"p": 1})
    b = write_manifest(_frame(), tmp_path / "b.parquet", {"p": 2})
    c = write_manifest(_frame().with_columns(pl.col("duration") + 0.001), tmp_path / "c.parquet")
    assert a == b != c
    assert (tmp_path / "a.parquet").read_bytes() != b""


def test_write_is_byte_identical(tmp_path) -> None:
    write_manifest(_frame(), tmp_path / "a.parquet")
    write_manifest(_frame(), tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_crash_mid_write_leaves_target_untouched(tmp_path) -> None:
    target = tmp_path / "m.parquet"
    write_manifest(_frame(), target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half a file")
            raise RuntimeError("crash")
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.parquet"]


def test_outputs_have_ordinary_permissions(tmp_path) -> None:
    import os

    write_manifest(_frame(), tmp_path / "m.parquet")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "m.parquet").stat().st_mode & 0o777 == 0o666 & ~mask


def test_not_a_manifest_is_one_line_error(tmp_path) -> None:
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ManifestError, match=r"x.parquet: not a readable Parquet file") as exc:
        read_manifest(bad)
    assert "\n" not in str(exc.value)
