"""No stale hash is trusted: a manifest edited with its metadata kept, a shard copied from
another plan, truncated or bit-flipped; the loader's cache follows the verified hash."""

from __future__ import annotations

import json

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from manifests.content_hash import recompute_hash
from manifests.errors import ManifestError
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import recorded_hash
from tests.hostile.conftest import refused, train_args
from tests.training._consumer import Corpus, invoke


def _edited_copy(corpus: Corpus, tmp_path: Path) -> Path:
    """The manifest with one duration changed by pyarrow, its metadata (and hash) kept."""
    t = pq.read_table(corpus.manifest)
    d = t.column("duration").to_pylist()
    d[0] = d[0] + 1.0
    t = t.set_column(t.schema.get_field_index("duration"), t.schema.field("duration"), pa.array(d))
    edited = tmp_path / "kept.parquet"
    pq.write_table(t, edited)  # the schema metadata, hash included, travels along
    assert recorded_hash(edited) == recorded_hash(corpus.manifest)
    return edited


def test_edited_manifest_is_refused_everywhere(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    edited = _edited_copy(corpus, tmp_path)
    why = ("content_hash", "rows hash to")
    refused("plan-batches", edited, "--buckets", corpus.buckets, "--world-size", "1", "-o", tmp_path / "p", match=why)
    refused("simulate", plan, "--manifest", edited, match=why)
    refused("export", "lhotse", plan, "--manifest", edited, "-o", tmp_path / "x", match=why)
    refused("verify", plan, "--manifest", edited, match=why)
    refused("fit-buckets", edited, "-o", tmp_path / "b.json", match=why)
    refused("filter", edited, "-o", tmp_path / "k2.parquet", match=why)
    refused(*train_args(corpus, plan, tmp_path / "ck", "--steps", "1"), "--manifest", edited, match=why)
    assert not (tmp_path / "ck" / "last.pt").exists()


def test_loader_cache_is_keyed_by_the_verified_hash(corpus: Corpus, tmp_path: Path) -> None:
    from dataprep.training import ColumnCache

    cache = tmp_path / "cache"
    cols = ColumnCache.open(corpus.manifest, cache)  # builds the cache under the real hash
    edited = _edited_copy(corpus, tmp_path)
    with pytest.raises(ManifestError, match="content_hash"):
        ColumnCache.open(edited, cache)  # a warm cache under the same recorded hash is not used
    assert cols.num_rows == pq.ParquetFile(corpus.manifest).metadata.num_rows


def test_hash_check_is_cached_by_file_facts_and_redone_when_they_change(corpus: Corpus, tmp_path: Path) -> None:
    m = tmp_path / "m.parquet"
    shutil.copy(corpus.manifest, m)
    cache = tmp_path / "cache"
    h = manifest_hash(m, cache)
    assert h == recompute_hash(m) == recorded_hash(m)
    entries = list((cache / "content-hash").iterdir())
    assert len(entries) == 1
    os.utime(m, ns=(1, 1))  # same bytes, new mtime: recomputed, still accepted
    assert manifest_hash(m, cache) == h
    # rewrite with other values under the old metadata and the old mtime: the footer differs
    t = pq.read_table(m)
    t = t.set_column(t.schema.get_field_index("num_tokens"), t.schema.field("num_tokens"),
                     pc.add(t.column("num_tokens"), 1).cast(pa.int32()))
    pq.write_table(t, m)
    os.utime(m, ns=(1, 1))
    with pytest.raises(ManifestError, match="content_hash"):
        manifest_hash(m, cache)


def test_shard_from_another_plan(corpus: Corpus, plan: Path, plan_copy: Path, tmp_path: Path) -> None:
    other = corpus.plan(1, seed=5)
    shutil.copy(other / "rank-00000.parquet", plan_copy / "rank-00000.parquet")
    why = ("rank-00000.parquet", "another plan")
    refused("simulate", plan_copy, match=why)
    refused("export", "nemo", plan_copy, "--manifest", corpus.manifest, "-o", tmp_path / "x", match=why)
    refused("verify", plan_copy, match=why)
    refused(*train_args(corpus, plan_copy, tmp_path / "ck", "--steps", "1"), match=why)


def test_truncated_and_missing_shard(corpus: Corpus, plan_copy: Path, tmp_path: Path) -> None:
    shard = plan_copy / "rank-00000.parquet"
    raw = shard.read_bytes()
    shard.write_bytes(raw[:-100])
    refused("simulate", plan_copy, match=("rank-00000.parquet", "not a Parquet file"))
    shard.write_bytes(raw + b"\0")
    refused("simulate", plan_copy, match="not a Parquet file")
    shard.unlink()
    refused("simulate", plan_copy, match=("rank-00000.parquet", "no such file"))
    refused(*train_args(corpus, plan_copy, tmp_path / "ck"), match="no such file")


def test_bit_flip_in_a_data_page(corpus: Corpus, plan: Path, plan_copy: Path, tmp_path: Path) -> None:
    shard = plan_copy / "rank-00000.parquet"
    raw = bytearray(shard.read_bytes())
    raw[200] ^= 0x04  # inside the first column chunk; size and footer unchanged
    shard.write_bytes(bytes(raw))
    refused("verify", plan_copy, match=("rank-00000.parquet", "SHA-256"))
    # readers catch it too: the pages are CRC-checked (simulate reads the damaged column) ...
    refused("simulate", plan_copy, match=("rank-00000.parquet", "corrupt row group"))
    # ... and export, reading only intact columns (bucket, rows), gives exactly the intact plan's export
    invoke("export", "nemo", str(plan_copy), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "x"))
    invoke("export", "nemo", str(plan), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "y"))
    for f in (tmp_path / "y").iterdir():
        got = (tmp_path / "x" / f.name).read_bytes().replace(str(tmp_path / "x").encode(), str(tmp_path / "y").encode())
        assert got == f.read_bytes(), f.name  # bucketing.yaml names its manifest_filepath (absolute)


def test_verify_accepts_an_intact_plan(corpus: Corpus, plan: Path) -> None:
    out = invoke("verify", str(plan), "--manifest", str(corpus.manifest))
    assert "ok" in out and "manifest ok" in out


def test_verify_recomputes_even_when_the_cheap_facts_match(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    """A byte changed in place with size, footer and mtime kept fools the cached check (by
    design: it is cheap); `verify --manifest` reads every row."""
    m = tmp_path / "kept.parquet"
    shutil.copy2(corpus.manifest, m)
    manifest_hash(m)  # verified and cached under its facts
    st = m.stat()
    original = pq.read_table(m)
    raw = bytes(m.read_bytes())
    footer_start = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    for pos in range(len(raw) // 3, footer_start):  # the first byte before the footer whose flip changes the rows
        edited = bytearray(raw)
        edited[pos] ^= 0x01
        m.write_bytes(bytes(edited))
        try:
            if not pq.read_table(m).equals(original):
                break
        except (OSError, pa.ArrowException):
            break
    else:
        pytest.fail("no single-bit edit before the footer changes the rows")
    os.utime(m, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert manifest_hash(m) == recorded_hash(m)  # the cheap check cannot see it
    line = refused("verify", plan, "--manifest", m)
    assert "content_hash" in line or "cannot be read" in line, line


def test_plan_from_an_older_version_says_to_plan_again(plan_copy: Path) -> None:
    meta = json.loads((plan_copy / "plan.json").read_text())
    for s in meta["shards"]:  # what plans written before shard sizes and footers were recorded hold
        del s["size"], s["footer_sha256"]
    (plan_copy / "plan.json").write_text(json.dumps(meta))
    refused("verify", plan_copy, match=("shards[0]", "older speech-dataprep", "plan-batches"))
