"""Dynamic resolution at a constant target, as a user runs it: oomptimize sizes each bucket at
its real dynamic-resolution shape (and the sizes fit that shape), plan-batches writes F per
batch, and refuses batch sizes made for another shape."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from bucketing.dynres import DynResConfig, bucket_frames
from dataprep.cli import app
from dataprep.testing import write_plan_inputs
from oom.fit import fitted_model
from oom.step import Shape

runner = CliRunner()
F = 800


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    folder = tmp_path_factory.mktemp("dynres")
    manifest, buckets = write_plan_inputs(folder, 600, seed=5, num_buckets=3, num_subbuckets=1)
    sized = {}
    for name, extra in (("2d", []), ("f", ["--dynamic-resolution", "--target-frames", str(F)])):
        out = folder / f"sized-{name}.json"
        r = runner.invoke(app, ["oomptimize", str(buckets), "--model", "tiny", "--estimate", "--gpu-memory", "40MiB",
                                "--tolerance", "0", "--max-batch", "2048", "--cache-dir", str(folder / "cache"),
                                "-o", str(out), *extra])
        assert r.exit_code == 0, r.output
        sized[name] = out
    return manifest, buckets, sized["2d"], sized["f"]


def test_oomptimize_sizes_each_bucket_at_its_dynamic_resolution_shape(inputs: tuple[Path, ...]) -> None:
    _, _, two, dyn = inputs
    a, b = json.loads(two.read_text()), json.loads(dyn.read_text())
    cfg = DynResConfig(target_frames=F)
    assert b["batch_size_source"]["shape_policy"] == cfg.shape_policy()
    assert a["batch_size_source"]["shape_policy"]["target_frames"] == "longest"
    maxd = [x["max_duration"] for x in b["buckets"]]
    assert [x["oom_shape"]["frames"] for x in b["buckets"]] == bucket_frames(maxd, cfg).tolist()
    assert [x["oom_shape"]["frames"] for x in a["buckets"]] == bucket_frames(maxd).tolist()
    budget = b["batch_size_source"]["budget_bytes"]
    # each size fits its real shape, one more does not (the estimate's laws, which equal full
    # traces to the byte: tests/oom/test_fit.py)
    laws = fitted_model("tiny", "batched")
    for x in b["buckets"]:
        shape = Shape(**x["oom_shape"])
        assert laws.peak(x["batch_size"], shape) <= budget < laws.peak(x["batch_size"] + 1, shape)
    # buckets whose longest has more than F frames at 100 Hz get larger batches, shorter ones smaller
    for x, y in zip(a["buckets"], b["buckets"]):
        if x["oom_shape"]["frames"] > y["oom_shape"]["frames"]:
            assert y["batch_size"] >= x["batch_size"]
        elif x["oom_shape"]["frames"] < y["oom_shape"]["frames"]:
            assert y["batch_size"] <= x["batch_size"]
    assert any(x["oom_shape"]["frames"] != y["oom_shape"]["frames"] for x, y in zip(a["buckets"], b["buckets"]))


def test_the_plan_takes_sizes_for_its_shape_only(inputs: tuple[Path, ...], tmp_path: Path) -> None:
    manifest, budget_sized, two, dyn = inputs

    def plan(buckets: Path, out: str, *extra: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, ["plan-batches", str(manifest), "--buckets", str(buckets), "-w", "2",
                                   "-o", str(tmp_path / out), *extra])

    r = plan(dyn, "ok", "--dynamic-resolution", "--target-frames", str(F))
    assert r.exit_code == 0, r.output
    assert "F=1000" in r.output and "encoder frames" in r.output
    t = pq.read_table(tmp_path / "ok" / "rank-00000.parquet")
    assert set(t.column("target_frames").to_pylist()) == {F}
    meta = json.loads((tmp_path / "ok" / "plan.json").read_text())["dynamic_resolution"]
    assert meta["config"]["target_frames"] == F and [c["policy"] for c in meta["compare"]][:2] == ["2d", "longest"]
    for buckets, extra in ((two, ["--dynamic-resolution", "--target-frames", str(F)]),
                           (budget_sized, ["--dynamic-resolution", "--target-frames", str(F)]),
                           (dyn, ["--dynamic-resolution", "--target-frames", "1000"]),
                           (dyn, ["--dynamic-resolution", "--target-frames", str(F), "--min-rate", "60"]),
                           (dyn, []), (dyn, ["--dynamic-resolution"])):
        r = plan(buckets, "bad", *extra)
        assert r.exit_code == 2, (extra, r.output)
        assert "batch sizes are for" in r.output and len(r.output.strip().splitlines()) == 1
    assert plan(two, "longest", "--dynamic-resolution").exit_code == 0
    r = plan(dyn, "bad", "--dynamic-resolution", "--target-frames", "abc")
    assert r.exit_code == 2 and "--target-frames" in r.output
    r = plan(dyn, "bad", "--dynamic-resolution", "--target-frames", "1")
    assert r.exit_code == 2 and "--target-frames: must be >= 800" in r.output


BAD_DYNRES = [  # (flags, the flag the one-line error names)
    (["--target-frames", "799"], "--target-frames"), (["--target-frames", "1601"], "--target-frames"),
    (["--target-frames", "1000.0"], "--target-frames"), (["--target-frames", "true"], "--target-frames"),
    (["--target-frames", "inf"], "--target-frames"), (["--frames-per-second", "inf"], "--frames-per-second"),
    (["--frames-per-second", "nan"], "--frames-per-second"), (["--frames-per-second", "0"], "--frames-per-second"),
    (["--min-rate", "nan"], "--min-rate"), (["--max-rate", "inf"], "--max-rate"),
    (["--min-rate", "140"], "--max-rate"), (["--floor-rate", "80"], "--min-rate"),
    (["--floor-rate", "-1"], "--floor-rate"), (["--max-rate", "1e9"], "--max-rate"),
]


@pytest.mark.parametrize("command", ["plan-batches", "oomptimize", "padding"])
def test_every_dynamic_resolution_flag_is_checked_with_its_name(inputs: tuple[Path, ...], tmp_path: Path,
                                                                 command: str) -> None:
    manifest, _, _, dyn = inputs
    args = {"plan-batches": ["plan-batches", str(manifest), "--buckets", str(dyn), "-w", "2", "-o",
                             str(tmp_path / "p"), "--dynamic-resolution"],
            "oomptimize": ["oomptimize", str(dyn), "--model", "tiny", "--estimate", "--gpu-memory", "40MiB",
                           "--no-cache", "-o", str(tmp_path / "s.json"), "--dynamic-resolution"],
            "padding": ["padding", str(manifest), "--buckets", str(dyn)]}[command]
    for flags, named in BAD_DYNRES:
        r = runner.invoke(app, [*args, *flags])
        assert r.exit_code == 2, (flags, r.output)
        assert r.output.startswith(f"error: {named}: ") and len(r.output.strip().splitlines()) == 1, (flags, r.output)
    assert not (tmp_path / "p").exists() and not (tmp_path / "s.json").exists()
