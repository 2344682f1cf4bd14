"""``filter_manifest`` streams its manifest in blocks: the kept and rejects files equal, byte
for byte, those written from the whole frame today (``apply_filters`` + ``write_manifest`` /
``write_rejects``), rows in = kept + rejected, and ``RowGroupWriter`` writes the bytes of a
whole-table write whatever the split of the rows pushed into it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.analysis.stats_and_filter import filter_manifest
from dataprep.analysis.filters import Thresholds, apply_filters
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import read_manifest, read_metadata
from manifests.manifest_write import RowGroupWriter, write_manifest, write_parquet_stream, write_rejects

value = st.one_of(st.floats(0.0, 60.0), st.sampled_from([math.nan, math.inf, None, 0.0, 25.0]))


@st.composite
def manifests(draw: Any) -> pl.DataFrame:
    n = draw(st.integers(0, 30))
    col = lambda strat: draw(st.lists(strat, min_size=n, max_size=n))  # noqa: E731
    cols: dict[str, Any] = {
        "id": [f"u{i}" for i in range(n)], "audio_path": [f"a{i}.wav" for i in range(n)],
        "duration": pl.Series(col(value), dtype=pl.Float64), "text": col(st.sampled_from(["a b", "", None])),
        "num_tokens": pl.Series(col(st.one_of(st.integers(0, 500), st.none())), dtype=pl.Int32),
        "tps": pl.Series(col(value), dtype=pl.Float64), "lang": col(st.sampled_from(["en", None])),
    }
    if draw(st.booleans()):  # some rows inside containers
        cols["container"] = col(st.sampled_from(["c.tar", None]))
        cols["member_offset"] = pl.Series(col(st.integers(0, 9)), dtype=pl.Int64)
    if draw(st.booleans()):
        cols["corpus"] = col(st.sampled_from(["ls", "cv", None]))
    return pl.DataFrame(cols)


thresholds = st.builds(Thresholds, max_tps=st.sampled_from([None, 25.0, 3.5]), min_duration=st.sampled_from([None, 0.5]),
                       max_duration=st.sampled_from([None, 40.0]), max_tokens=st.sampled_from([None, 200]))


def filter_today(manifest: Path, out: Path, rejects: Path, th: Thresholds) -> None:
    """``filter_manifest`` as it was: the whole frame in memory."""
    df = read_manifest(manifest)
    r = apply_filters(df, th)
    provenance = {"command": "filter", "input": manifest.name, "input_hash": manifest_hash(manifest),
                  "thresholds": th.to_json(), "rows_in": r.rows_in, "kept": r.kept.height,
                  "rejected": r.rejected.height}
    write_manifest(r.kept, out, provenance=provenance)
    write_rejects(r.rejected, rejects, provenance=provenance)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(manifests(), thresholds, st.integers(1, 7))
def test_streamed_filter_writes_todays_bytes(tmp_path: Path, df: pl.DataFrame, th: Thresholds, rows: int) -> None:
    manifest = tmp_path / "m.parquet"
    write_manifest(df, manifest)
    filter_today(manifest, tmp_path / "old.parquet", tmp_path / "old.rejects.parquet", th)
    s = filter_manifest(manifest, tmp_path / "new.parquet", th, tmp_path / "new.rejects.parquet", block_rows=rows)
    for name in ("", ".rejects"):
        assert (tmp_path / f"new{name}.parquet").read_bytes() == (tmp_path / f"old{name}.parquet").read_bytes()
    kept = pq.read_metadata(tmp_path / "new.parquet").num_rows
    rejected = pq.read_table(tmp_path / "new.rejects.parquet")
    assert s.rows_in == df.height == kept + rejected.num_rows == s.kept + s.rejected
    assert sum(c.rejected for c in s.counts) == s.rejected
    assert rejected.column("reason").null_count == 0
    assert read_metadata(tmp_path / "new.parquet")["provenance"]["kept"] == kept


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 40), st.integers(1, 9), st.lists(st.integers(1, 11), min_size=1, max_size=8))
def test_row_group_writer_equals_a_whole_table_write(tmp_path: Path, n: int, group: int, cuts: list[int]) -> None:
    table = pa.table({"id": [f"u{i}" for i in range(n)], "x": pa.array(range(n), pa.int64())})
    whole = tmp_path / "whole.parquet"
    write_parquet_stream(lambda: [table], whole, table.schema, "manifest", row_group_size=group)
    schema = pq.read_schema(whole)
    pushed = tmp_path / "pushed.parquet"
    with RowGroupWriter(pushed, schema, group) as w:
        at, k = 0, 0
        while at < n:
            w.write(table.slice(at, cuts[k % len(cuts)]))
            at, k = at + cuts[k % len(cuts)], k + 1
    assert w.rows == n and pushed.read_bytes() == whole.read_bytes()
