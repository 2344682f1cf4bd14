"""The loader's column cache (v5): streamed build, mapped read, refusal of what it must not trust."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifests.column_cache import (
    CACHE_META,
    CACHE_SCHEMA,
    CACHE_VERSION,
    ColumnCache,
    build_column_cache,
    write_ipc_file,
)
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import read_manifest
from tests.manifests._loader_manifest import rewrite_cache_facts, write_loader_manifest

ROWS = 90


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame]:
    """90 rows: files shared by a few rows, null langs, offsets, texts and a container column."""
    path = write_loader_manifest(tmp_path_factory.mktemp("cc") / "m.parquet", ROWS, 7, langs=("en", "de", "fr"), files=25)
    return path, read_manifest(path)


def _cache_path(manifest: Path, cache: Path) -> Path:
    return cache / f"{manifest_hash(manifest)}.v{CACHE_VERSION}.arrow"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_rows=st.integers(min_value=1, max_value=ROWS + 5),
       picks=st.lists(st.integers(min_value=0, max_value=ROWS - 1), max_size=40))
def test_round_trip_over_any_record_batch_size(manifest: tuple[Path, pl.DataFrame], tmp_path_factory:
                                               pytest.TempPathFactory, batch_rows: int, picks: list[int]) -> None:
    path, df = manifest
    cache = tmp_path_factory.mktemp("c")
    cache_file = _cache_path(path, cache)
    build_column_cache(path, cache_file, batch_rows=batch_rows)  # one dictionary per record batch
    built = cache_file.stat().st_mtime_ns
    cols = ColumnCache.open(path, cache)
    assert cols.num_rows == ROWS
    rows = np.array(picks, dtype=np.int64)
    m = cols.gather(rows, [str(r) for r in picks])
    assert m.audio_paths == df["audio_path"].gather(rows).to_list()
    assert m.texts == df["text"].fill_null("").gather(rows).to_list()
    assert m.langs == df["lang"].gather(rows).to_list()
    assert m.container_paths == df["container"].gather(rows).to_list()
    np.testing.assert_array_equal(m.offsets, df["offset"].fill_null(0.0).to_numpy()[rows])
    np.testing.assert_array_equal(m.durations, df["duration"].to_numpy()[rows])
    np.testing.assert_array_equal(m.num_tokens, df["num_tokens"].to_numpy()[rows])
    np.testing.assert_array_equal(m.member_offsets, df["member_offset"].fill_null(-1).to_numpy()[rows])
    np.testing.assert_array_equal(m.member_sizes, df["member_size"].fill_null(-1).to_numpy()[rows])
    np.testing.assert_array_equal(m.row_groups, np.full(len(picks), -1))
    assert m.num_tokens.dtype == np.int64 and m.member_offsets.dtype == np.int64
    assert len(cols.text) == ROWS and cache_file.stat().st_mtime_ns == built  # mapped, not rebuilt


@pytest.mark.parametrize(("facts", "why"), [
    ({"version": CACHE_VERSION - 1}, f"layout version {CACHE_VERSION - 1}"),
    ({"content_hash": "0" * 64}, "another manifest"),
    ({"rows": ROWS + 1}, "the manifest has"),
])
def test_a_cache_whose_facts_differ_is_refused_and_rebuilt(manifest: tuple[Path, pl.DataFrame], tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture,
                                                           facts: dict[str, object], why: str) -> None:
    path, df = manifest
    ColumnCache.open(path, tmp_path)
    cache_file = _cache_path(path, tmp_path)
    rewrite_cache_facts(cache_file, CACHE_META, stream=True, **facts)
    with caplog.at_level(logging.WARNING, logger="manifests.column_cache"):
        cols = ColumnCache.open(path, tmp_path)
    assert why in caplog.text and "rebuilding" in caplog.text
    assert cols.gather(np.array([5]), ["x"]).audio_paths == [df["audio_path"][5]]
    assert json.loads(pa.ipc.open_stream(pa.memory_map(str(cache_file))).schema.metadata[CACHE_META.encode()]) == {
        "version": CACHE_VERSION, "content_hash": manifest_hash(path), "rows": ROWS}


@pytest.mark.parametrize("cut", [0.5, 0.97])
def test_a_truncated_cache_is_rebuilt_with_the_reason(manifest: tuple[Path, pl.DataFrame], tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture, cut: float) -> None:
    path, df = manifest
    cache_file = _cache_path(path, tmp_path)
    build_column_cache(path, cache_file, batch_rows=16)
    data = cache_file.read_bytes()
    cache_file.write_bytes(data[: int(len(data) * cut)])  # as a copy cut short could leave it
    with caplog.at_level(logging.WARNING, logger="manifests.column_cache"):
        cols = ColumnCache.open(path, tmp_path)
    assert "refused" in caplog.text
    assert cols.gather(np.array([ROWS - 1, 0]), ["a", "b"]).texts == df["text"].fill_null("").gather([ROWS - 1, 0]).to_list()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="manifests.column_cache"):
        assert ColumnCache.open(path, tmp_path).num_rows == ROWS
    assert caplog.text == ""  # rebuilt whole: mapped as it is


def test_the_build_is_atomic_and_replaces_older_versions(manifest: tuple[Path, pl.DataFrame], tmp_path: Path) -> None:
    path, _ = manifest
    old = tmp_path / f"{manifest_hash(path)}.v4.arrow"
    old.write_bytes(b"an old layout")
    cols = ColumnCache.open(path, tmp_path)
    assert cols.num_rows == ROWS and not old.exists()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [_cache_path(path, tmp_path).name, _cache_path(path, tmp_path).name + ".lock"]
    # a build that fails half way leaves no file behind: the next open builds it whole
    bad = tmp_path / "bad"
    bad.mkdir()
    target = _cache_path(path, bad)

    def failing() -> object:
        yield next(iter(pa.ipc.open_stream(pa.memory_map(str(_cache_path(path, tmp_path))))))
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_ipc_file(target, CACHE_SCHEMA, failing(), stream=True)  # type: ignore[arg-type]
    assert list(bad.iterdir()) == []
