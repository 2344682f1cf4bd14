"""The one fit writes the same bytes held in memory (one block) and spilled (tiny limits:
small blocks, sorted ranges of 256 values), and the spill runs when it must."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import dataprep.analysis.buckets as fit_module
from bucketing.fit_passes import MIN_SORT_ROWS, Passes, fit_blocks, fit_spec
from dataprep.cli import app
from dataprep.analysis.buckets import manifest_blocks
from manifests.buckets_file import write_buckets
from manifests.hash_cache import manifest_hash
from manifests.manifest_write import write_manifest
from manifests.spill import SpillFiles, sorted_runs

runner = CliRunner()


def _frame(d: np.ndarray, t: np.ndarray | list) -> pl.DataFrame:
    n = len(d)
    return pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": d, "num_tokens": t, "text": ["x"] * n})


def _corpus(seed: int, n: int, kind: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == 0:  # continuous durations, far-out clips
        d = rng.gamma(4, 2.5, n) + 0.05
        d[rng.integers(0, n, max(n // 200, 1))] *= 10
    elif kind == 1:  # rounded: many ties
        d = np.round(rng.gamma(4, 2.5, n) + 0.5, 1)
    elif kind == 2:  # a few values, one holding most rows
        d = rng.choice([1.0, 2.5, 3.0, 3.0, 3.0, 3.0, 7.25], n)
    else:  # lognormal, full precision
        d = rng.lognormal(2.0, 0.6, n)
    span = [3, 40, 5000, 300000][int(rng.integers(0, 4))]
    t = np.minimum((d * rng.uniform(1, 6, n)).astype(np.int64), span) + rng.integers(0, 3, n) + 1
    return d, t


OPTIONS = st.fixed_dictionaries({
    "num_buckets": st.integers(1, 12),
    "num_subbuckets": st.integers(1, 4),
    "min_duration": st.sampled_from([None, 1.5]),
    "max_duration": st.sampled_from([None, 25.0]),
    "strict": st.booleans(),
    "outlier_fence": st.sampled_from([None, 0.0, 1.5, 3.0]),
    "token_fence": st.sampled_from([None, 0.5, 2.0]),
})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), n=st.integers(1, 1200), kind=st.integers(0, 3), opts=OPTIONS,
       block=st.sampled_from([97, 1024]))
def test_spilled_equals_held(tmp_path: Path, seed: int, n: int, kind: int, opts: dict, block: int) -> None:
    """Random corpora and options: held in memory (one block) and spilled (blocks of ``block``
    rows, sorted ranges of 256 values, split down to single values where one holds more) write
    the same bytes; the spill files were written; the arrays' entry (:func:`fit_spec`) agrees."""
    d, t = _corpus(seed, n, kind)
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        w = Path(work)
        m = w / "m.parquet"
        write_manifest(_frame(d, t), m)
        kw = dict(max_duration_budget=600.0, max_frames_budget=None, max_tokens_budget=None, frame_shift=0.01,
                  manifest_hash="h", **opts)
        held = Passes.held(n)
        spilled = Passes(SpillFiles(w), block, MIN_SORT_ROWS)
        try:
            want, alloc = fit_blocks(manifest_blocks(m, held.block), held, **kw)
        except ValueError as exc:  # e.g. the caps leave nothing: the same message spilled
            with pytest.raises(ValueError, match=re.escape(str(exc))):
                fit_blocks(manifest_blocks(m, block), spilled, **kw)
            return
        got, sa = fit_blocks(manifest_blocks(m, block), spilled, **kw)
        assert spilled.files.written_bytes() >= 16 * (n - alloc.num_dropped)  # d and t of the rows within the caps
        assert held.files.written_bytes() == 0 and not (Path() / "d").exists()
        write_buckets(want, w / "a.json")
        write_buckets(got, w / "b.json")
        write_buckets(fit_spec(d, t, **kw)[0], w / "c.json")
        assert (w / "a.json").read_bytes() == (w / "b.json").read_bytes() == (w / "c.json").read_bytes()
        assert sa.dropped == alloc.dropped


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.floats(0, 1e6, allow_nan=False, allow_subnormal=True), max_size=300),
       max_rows=st.integers(1, 400))
def test_sorted_runs_sort(tmp_path: Path, values: list[float], max_rows: int) -> None:
    """Runs of at most max_rows values that concatenate to np.sort (zeros and subnormals too)."""
    x = np.asarray(values, dtype=np.float64)
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        files = SpillFiles(Path(work))
        files.append("x", x)
        files.close()
        runs = list(sorted_runs(files, "x", x.shape[0], max_rows))
        assert all(0 < r.shape[0] <= max_rows for r in runs)
        got = np.concatenate(runs) if runs else np.empty(0)
        assert np.array_equal(got, np.sort(x))


def test_cli_tiny_memory_limit_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fit-buckets under the default limit (held, no spill) and under 64 KiB (spilled: sorted
    ranges of 256 durations) writes the same bytes and prints the same lines."""
    d, t = _corpus(5, 4000, 0)
    m = tmp_path / "m.parquet"
    write_manifest(_frame(d, t), m)
    spills: list[Path] = []
    real = fit_module.spill_dir
    monkeypatch.setattr(fit_module, "spill_dir", lambda out: spills.append(real(out)) or spills[-1])
    args = ["fit-buckets", str(m), "--num-buckets", "10", "--max-duration", "40", "--min-duration", "1"]
    a = runner.invoke(app, [*args, "-o", str(tmp_path / "a.json")])
    assert not spills  # held: nothing spilled
    b = runner.invoke(app, [*args, "-o", str(tmp_path / "b.json"), "--memory-limit", "64KiB"])
    assert len(spills) == 1  # spilled
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.output == b.output.replace("b.json", "a.json")  # the same table and left-out lines
    assert "reason max_duration" in a.output and "reason min_duration" in a.output
    want, _ = fit_spec(d, t, num_buckets=10, min_duration=1.0, max_duration=40.0, manifest_hash=manifest_hash(m))
    write_buckets(want, tmp_path / "mem.json")
    assert (tmp_path / "mem.json").read_bytes() == (tmp_path / "a.json").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".spill")]  # spill files removed


@pytest.mark.parametrize("case", ["no_tokens", "bad_duration", "memory_limit", "no_rows"])
def test_cli_errors_one_line(tmp_path: Path, case: str) -> None:
    d, t = _corpus(1, 3000, 1)
    args: list[str] = []
    if case == "no_tokens":
        t = [None if i % 7 == 0 else int(x) for i, x in enumerate(t)]
        want = "429 rows have no num_tokens"
    elif case == "bad_duration":
        d[2500] = -1.0
        want = "durations must be finite and > 0"
    elif case == "memory_limit":
        want = "--memory-limit"
    else:
        args = ["--min-duration", "1000"]
        want = "no rows left to fit"
    m = tmp_path / "m.parquet"
    write_manifest(_frame(d, t), m)
    limit = "lots" if case == "memory_limit" else "16KiB"
    r = runner.invoke(app, ["fit-buckets", str(m), "-o", str(tmp_path / "b.json"), "--memory-limit", limit, *args])
    assert r.exit_code == 2, r.output
    assert want in r.output and len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "b.json").exists()
