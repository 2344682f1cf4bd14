"""``dataprep padding`` (dataprep/analysis/stream_padding.py) spilled to disk under a tiny
memory limit gives the report held in memory at the default one, figure for figure (and the
steps of :func:`bucketing.steps_report.steps_report`); rows in = rows in the report."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import bucketing.padding as padding
from bucketing.fit_passes import fit_spec
from bucketing.dynres import DynResConfig
from bucketing.fit import grid_from_spec
from bucketing.plan import PlanError
from bucketing.steps_report import steps_report
from dataprep.cli import app
import dataprep.analysis.stream_padding as stream_padding
from dataprep.analysis.padding import batch_sizes_for, manifest_padding_report
from dataprep.analysis.stream_padding import PADDING_BYTES_PER_ROW
from manifests.buckets_file import read_buckets, write_buckets
from manifests.errors import DataprepError
from manifests.manifest_write import write_manifest

runner = CliRunner()


@pytest.fixture
def spills(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The spill folders the padding report makes (one per report spilled to disk)."""
    made: list[Path] = []
    real = stream_padding.spill_dir

    def spy(where: object) -> Path:
        made.append(real(where))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(stream_padding, "spill_dir", spy)
    return made


def _manifest(path: Path, seed: int, n: int, corpora: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = np.round(rng.gamma(3, 3, n) + 0.2, int(rng.integers(1, 4)))
    d[rng.integers(0, n, max(n // 100, 1))] *= 6  # some over 30 / 40 s
    t = (d * rng.uniform(1, 6, n)).astype(np.int64) + rng.integers(0, 3, n) + 1
    df = pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": d, "num_tokens": t, "text": ["x"] * n})
    if corpora:
        df = df.with_columns(pl.Series("corpus", [f"c{i}" for i in rng.integers(0, corpora, n)]))
    write_manifest(df, path)
    return d, t


def _check_counts(rep: dict, n: int) -> None:
    """Rows in = rows in the report, per scheme."""
    s = rep["schemes"]
    for name, x in s.items():
        assert x["num_rows"] + x["excluded"] == n, name
    assert sum(b["num_rows"] for b in rep["per_bucket"]) + sum(rep["dropped"].values()) == n
    if "per_corpus" in rep:
        assert sum(c["utterances"] for c in rep["per_corpus"]) == s["2d"]["num_rows"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), n=st.integers(1, 700), corpora=st.sampled_from([0, 1, 3]),
       num_buckets=st.integers(1, 6), sub=st.integers(1, 3), strict=st.booleans(), carry=st.booleans(),
       window=st.sampled_from([None, 1, 3]), sort_by=st.sampled_from([None, "tokens", "none"]),
       dyn=st.booleans(), parts=st.sampled_from([7, 1000, 1 << 22]), chunk=st.sampled_from([5, 64, 1 << 19]),
       tiny=st.sampled_from([1 << 16, None]))
def test_spilled_equals_in_memory(tmp_path: Path, spills: list[Path], seed: int, n: int, corpora: int,
                                  num_buckets: int, sub: int, strict: bool, carry: bool, window: int | None,
                                  sort_by: str | None, dyn: bool, parts: int, chunk: int, tiny: int | None) -> None:
    """Random corpora and options, scatter parts and bucket chunks of a few rows, a tiny limit
    (below what the rows need in memory) and the default one: the same report, spilled to
    disk at the tiny limit only."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as work, pytest.MonkeyPatch.context() as mp:
        mp.setattr(padding, "SCATTER_ROWS", parts)
        mp.setattr(padding, "CHUNK_ROWS", chunk)
        w = Path(work)
        d, t = _manifest(w / "m.parquet", seed, n, corpora)
        spec, _ = fit_spec(d, t, num_buckets=num_buckets, num_subbuckets=sub, max_duration_budget=120.0)
        write_buckets(spec, w / "b.json")
        opts = dict(seed=seed % 1000, strict=strict, carry=carry, window=None if window is None else min(window, n),
                    sort_by=sort_by, dynamic_resolution=DynResConfig() if dyn else None)
        spills.clear()
        want = manifest_padding_report(w / "m.parquet", w / "b.json", **opts)
        assert spills == []  # held in memory at the default limit
        limit = min(tiny or n * PADDING_BYTES_PER_ROW, n * PADDING_BYTES_PER_ROW) - 1
        try:
            got = manifest_padding_report(w / "m.parquet", w / "b.json", memory_limit=limit, **opts)
        except DataprepError as exc:  # a bucket over a tiny limit: the planner's one-line refusal
            assert "--memory-limit: bucket" in str(exc), exc
            return
        finally:
            assert len(spills) == 1  # spilled to disk
        assert got == want
        _check_counts(got, n)
        assert not [p for p in w.iterdir() if p.name.endswith(".spill")]  # spill files removed


def test_cli_tiny_memory_limit_same_report(tmp_path: Path, spills: list[Path]) -> None:
    """The command as a user runs it: under a limit the corpus does not fit, the same JSON
    and the same tables, --world-sizes too; a world size over the rows is one line in both."""
    n = 3000
    m = tmp_path / "m.parquet"
    _manifest(m, 3, n, 2)
    fit = runner.invoke(app, ["fit-buckets", str(m), "--num-buckets", "6", "-o", str(tmp_path / "b.json")])
    assert fit.exit_code == 0, fit.output
    args = ["padding", str(m), "--buckets", str(tmp_path / "b.json"), "--world-sizes", "8,32"]
    limit = f"{n * PADDING_BYTES_PER_ROW // 2}B"
    a = runner.invoke(app, [*args, "--json", str(tmp_path / "a.json")])
    assert spills == []
    b = runner.invoke(app, [*args, "--json", str(tmp_path / "b2.json"), "--memory-limit", limit])
    assert len(spills) == 1
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ra, rb = json.loads((tmp_path / "a.json").read_text()), json.loads((tmp_path / "b2.json").read_text())
    assert ra == rb and [(r["world_size"], r["balance"]) for r in rb["steps"]] == [(8, 0.0), (8, 0.05), (32, 0.0),
                                                                                      (32, 0.05)]
    _check_counts(ra, n)
    assert a.output == b.output.replace("b2.json", "a.json")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".spill")]
    for extra in ([], ["--memory-limit", limit]):
        c = runner.invoke(app, [*args[:-1], f"8,{n + 1}", *extra])
        assert c.exit_code == 2 and "--world-sizes: must be <= the number of rows (3000)" in c.output, c.output
        assert len(c.output.strip().splitlines()) == 1, c.output


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), n=st.integers(1, 400), num_buckets=st.integers(1, 5), sub=st.integers(1, 2),
       world=st.integers(1, 48), balance=st.sampled_from([0.0, 0.05, 0.3]), strict=st.booleans(),
       carry=st.booleans())
def test_spilled_steps_equal_in_memory(tmp_path: Path, spills: list[Path], seed: int, n: int, num_buckets: int, sub: int, world: int,
                                       balance: float, strict: bool, carry: bool) -> None:
    """Random corpora, world sizes and seeds at the default limit (held in memory) and under a
    limit below what the rows need in memory (spilled to disk): the same ``steps`` as
    :func:`bucketing.steps_report.steps_report`, or the same one-line error."""
    world = min(world, n)
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        w = Path(work)
        d, t = _manifest(w / "m.parquet", seed, n, 0)
        spec, _ = fit_spec(d, t, num_buckets=num_buckets, num_subbuckets=sub, max_duration_budget=120.0)
        write_buckets(spec, w / "b.json")
        _, bs = batch_sizes_for(read_buckets(w / "b.json"))
        opts = dict(seed=seed % 1000, strict=strict, carry=carry)
        try:
            want: object = steps_report(d, t, grid_from_spec(read_buckets(w / "b.json")), bs, [world], balance, **opts)
        except PlanError as exc:
            want = f"cannot plan: {exc}"
        for limit in (None, n * PADDING_BYTES_PER_ROW - 1):
            spills.clear()
            try:
                got: object = manifest_padding_report(w / "m.parquet", w / "b.json", world_sizes=[world],
                                                      balance=balance, memory_limit=limit, **opts)["steps"]
            except DataprepError as exc:
                if "--memory-limit: bucket" in str(exc):  # a bucket over the tiny limit: the planner's refusal
                    assert limit is not None
                    continue
                got = str(exc).split(": ", 1)[1]
            assert got == want
            assert len(spills) == (limit is not None)
        assert not [p for p in w.iterdir() if p.name.endswith(".spill")]


def test_too_little_disk_for_the_spill_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple

    n = 2000
    m = tmp_path / "m.parquet"
    _manifest(m, 4, n, 0)
    fit = runner.invoke(app, ["fit-buckets", str(m), "--num-buckets", "4", "-o", str(tmp_path / "b.json")])
    assert fit.exit_code == 0, fit.output
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda where: usage(1 << 40, (1 << 40) - 1000, 1000))
    res = runner.invoke(app, ["padding", str(m), "--buckets", str(tmp_path / "b.json"),
                              "--memory-limit", f"{n * PADDING_BYTES_PER_ROW // 2}B"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "spill files need about" in res.output
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".spill")]
