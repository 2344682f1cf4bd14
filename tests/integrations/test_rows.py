"""The row cache that Lhotse/NeMo cuts and lookup read: streamed build, fixed batches fetched on use, refusals."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.integrations.rows import (
    ROWS_CACHE_VERSION,
    ROWS_META,
    ROWS_PER_BATCH,
    ManifestRows,
    build_rows_cache,
    index_path,
)
from manifests.column_cache import write_ipc_file
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash
from tests.manifests._loader_manifest import rewrite_cache_facts, write_loader_manifest

ROWS = 70


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """70 rows with nulls in strings and numbers, non-ASCII text, containers and ``extra``."""
    path = write_loader_manifest(tmp_path_factory.mktemp("rows") / "m.parquet", ROWS, 3, all_columns=True)
    return path, pq.read_table(path).to_pylist()


def _cache_path(manifest: Path, cache: Path, version: int = ROWS_CACHE_VERSION) -> Path:
    return cache / f"{manifest_hash(manifest)}.rows.v{version}.arrow"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_rows=st.integers(min_value=1, max_value=ROWS + 5),
       picks=st.lists(st.integers(min_value=0, max_value=ROWS - 1), max_size=30))
def test_records_are_the_manifest_rows_over_any_block_size(manifest: tuple[Path, list[dict[str, object]]],
                                                          tmp_path_factory: pytest.TempPathFactory,
                                                          batch_rows: int, picks: list[int]) -> None:
    path, rows = manifest
    cache = tmp_path_factory.mktemp("c")
    build_rows_cache(path, _cache_path(path, cache), batch_rows=batch_rows)
    got = ManifestRows.open(path, cache)
    assert got.num_rows == ROWS and got.batch_rows == batch_rows
    assert got.records(picks) == [rows[i] for i in picks]  # values, None where null, Python types
    assert got.records(picks, ["duration", "id"]) == [{"duration": rows[i]["duration"], "id": rows[i]["id"]}
                                                      for i in picks]


def test_a_row_past_the_manifest_is_a_one_line_error(manifest: tuple[Path, list[dict[str, object]]],
                                                     tmp_path: Path) -> None:
    with pytest.raises(DataprepError, match=f"row {ROWS} asked for, the manifest has {ROWS} rows"):
        ManifestRows.open(manifest[0], tmp_path).records([0, ROWS])


@pytest.mark.parametrize(("facts", "why"), [
    ({"version": 1}, "layout version 1"),
    ({"content_hash": "0" * 64}, "another manifest"),
    ({"rows": ROWS + 1}, f"not {ROWS + 1} rows in batches of"),
])
def test_a_cache_whose_facts_differ_is_refused_and_rebuilt(manifest: tuple[Path, list[dict[str, object]]],
                                                           tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           facts: dict[str, object], why: str) -> None:
    path, rows = manifest
    ManifestRows.open(path, tmp_path)
    cache_file = _cache_path(path, tmp_path)
    rewrite_cache_facts(cache_file, ROWS_META, stream=False, **facts)
    with caplog.at_level(logging.WARNING, logger="dataprep.integrations.rows"):
        got = ManifestRows.open(path, tmp_path)
    assert why in caplog.text and "row cache is refused" in caplog.text and "rebuilding" in caplog.text
    assert got.records([5]) == [rows[5]]
    meta = pa.ipc.open_file(pa.memory_map(str(cache_file))).schema.metadata[ROWS_META.encode()]
    assert json.loads(meta).items() >= {"version": ROWS_CACHE_VERSION, "content_hash": manifest_hash(path),
                                        "rows": ROWS, "batch_rows": ROWS_PER_BATCH}.items()


def test_a_layout_break_or_a_foreign_index_is_rebuilt_and_a_damaged_index_is_one_line(
        manifest: tuple[Path, list[dict[str, object]]], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, rows = manifest
    cache_file = _cache_path(path, tmp_path)
    build_rows_cache(path, cache_file, batch_rows=16)
    with pa.memory_map(str(cache_file)) as src:
        reader = pa.ipc.open_file(src)
        schema = reader.schema
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    write_ipc_file(cache_file, schema, [batches[0].slice(0, 8), batches[0].slice(8), *batches[1:]])  # facts right
    with caplog.at_level(logging.WARNING, logger="dataprep.integrations.rows"):
        assert ManifestRows.open(path, tmp_path).records([3]) == [rows[3]]
    assert "not 70 rows in batches of 16" in caplog.text
    for damage, why in ((lambda a: a[:-6], "not the one written with it"), (lambda a: a * 0, "not the one written")):
        np.save(index_path(cache_file), damage(np.load(index_path(cache_file))))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dataprep.integrations.rows"):
            assert ManifestRows.open(path, tmp_path).records([ROWS - 1]) == [rows[ROWS - 1]]
        assert why in caplog.text and "rebuilding" in caplog.text
    index_path(cache_file).unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dataprep.integrations.rows"):
        assert ManifestRows.open(path, tmp_path).records([ROWS - 1]) == [rows[ROWS - 1]]
    assert "buffer index is missing" in caplog.text
    # an index whose header is right but whose positions point past a buffer: found on the read
    good = np.load(index_path(cache_file))
    bad = good.copy()
    bad[6 + 3::6] += 10 ** 9  # every values/offsets buffer's size
    bad[6 + 2::6] += 10 ** 9  # and position: past the mapping
    np.save(index_path(cache_file), bad)
    with pytest.raises(DataprepError, match=r"the row cache of .* is damaged \(a value outside its buffer\); delete"):
        ManifestRows.open(path, tmp_path).records([3])
    data = cache_file.read_bytes()
    cache_file.write_bytes(data[: len(data) // 2])  # as a copy cut short could leave it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dataprep.integrations.rows"):
        assert ManifestRows.open(path, tmp_path).records([ROWS - 1]) == [rows[ROWS - 1]]
    assert "not a whole Arrow IPC file" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dataprep.integrations.rows"):
        assert ManifestRows.open(path, tmp_path).num_rows == ROWS
    assert caplog.text == ""  # rebuilt whole: mapped as it is


def test_the_build_is_atomic_and_replaces_the_older_layout(manifest: tuple[Path, list[dict[str, object]]],
                                                           tmp_path: Path) -> None:
    path, _ = manifest
    olds = [_cache_path(path, tmp_path, v) for v in range(1, ROWS_CACHE_VERSION)]
    for old in olds:
        old.write_bytes(b"a cache of an older layout: never read")
    assert ManifestRows.open(path, tmp_path).num_rows == ROWS
    assert not any(old.exists() for old in olds)
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    cache_file = _cache_path(path, tmp_path)
    assert left == sorted([cache_file.name, index_path(cache_file).name])  # no temporary file left behind
