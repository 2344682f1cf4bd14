"""Option values out of range: one line naming the option, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.conftest import refused
from tests.training._consumer import Corpus


@pytest.mark.parametrize("option,value,problem", [
    ("--prompt-tokens", "-100", "must be >= 0"),
    ("--mismatch-tolerance", "-1", "must be >= 0"),
    ("--mismatch-tolerance", "nan", "finite"),
    ("--max-plausible-duration", "0", "must be > 0"),
    ("--max-plausible-duration", "inf", "finite"),
    ("--probe-threads", "0", "must be >= 1"),
    ("--workers", "0", "must be >= 1"),
    ("--num-parts", "0", "must be >= 1"),
    ("--part-index", "-1", "must be >= 0"),
])
def test_compile_options(corpus: Corpus, tmp_path: Path, option: str, value: str, problem: str) -> None:
    out = tmp_path / "m.parquet"
    refused("compile", corpus.source, "--tokenizer", corpus.spm, "-o", out, option, value, match=(option, problem))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option,value,problem", [
    ("--max-duration-budget", "0", "must be > 0"),
    ("--max-duration-budget", "-10", "must be > 0"),
    ("--max-duration-budget", "nan", "finite"),
    ("--max-duration-budget", "inf", "finite"),
    ("--max-frames-budget", "0", "must be >= 1"),
    ("--max-tokens-budget", "-5", "must be >= 1"),
    ("--frame-shift", "0", "must be > 0"),
    ("--frame-shift", "nan", "finite"),
    ("--min-duration", "-1", "must be >= 0"),
    ("--token-fence", "nan", "finite"),
])
def test_fit_buckets_options(corpus: Corpus, tmp_path: Path, option: str, value: str, problem: str) -> None:
    out = tmp_path / "b.json"
    refused("fit-buckets", corpus.manifest, "-o", out, option, value, match=(option, problem))
    assert not out.exists()


@pytest.mark.parametrize("option,value,problem", [
    ("--row-group-steps", "0", "must be >= 1"),
    ("--world-size", "0", "must be >= 1"),
    ("--epochs", "0", "must be >= 1"),
])
def test_plan_batches_options(corpus: Corpus, tmp_path: Path, option: str, value: str, problem: str) -> None:
    args = {"--world-size": "1", "--epochs": "1", option: value}
    flat = [x for kv in args.items() for x in kv]
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "-o", tmp_path / "p", *flat,
            match=(option, problem))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("option,value", [("--max-tps", "nan"), ("--min-duration", "-1"), ("--max-tokens", "-3")])
def test_filter_options(corpus: Corpus, tmp_path: Path, option: str, value: str) -> None:
    refused("filter", corpus.manifest, "-o", tmp_path / "k.parquet", option, value, match=option)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option,value,problem", [
    ("--lr", "0", "must be > 0"), ("--lr", "nan", "finite"), ("--nproc", "0", "must be >= 1"),
    ("--steps", "-1", "must be >= 0"), ("--timeout", "0", "must be > 0"), ("--device", "tpu", "auto, cpu or cuda"),
])
def test_train_options(corpus: Corpus, plan: Path, tmp_path: Path, option: str, value: str, problem: str) -> None:
    refused("train", plan, "--manifest", corpus.manifest, "--tokenizer", corpus.spm, "--checkpoint-dir",
            tmp_path / "ck", option, value, match=(option, problem))
    assert not (tmp_path / "ck").exists()


def test_padding_and_simulate_options(corpus: Corpus, plan: Path) -> None:
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, "--max-duration-budget", "-1",
            match="--max-duration-budget")
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, "--window", "0", match="--window")
    refused("simulate", plan, "--world-sizes", "2,0", match="--world-sizes")
    refused("simulate", plan, "--epoch", "-1", match="--epoch")
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, "--balance", "-1", match="--balance")
    refused("simulate", plan, "--exchange", "nan", match="--exchange")
    refused("simulate", plan, "--strategy", "hybrid", "--group-size", "0", match="--group-size")
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "--world-size", "1", "-o", plan.parent / "p9",
            "--coef", "overhead=nan", match="overhead=nan")


def test_rejects_default_shown_by_help_is_the_real_one(corpus: Corpus, tmp_path: Path) -> None:
    from tests.training._consumer import runner
    from dataprep.cli import app

    help_text = runner.invoke(app, ["compile", "--help"], env={"COLUMNS": "300"}).stdout
    assert "<output stem>.rejects.parquet" in " ".join(help_text.replace("│", " ").split())
    res = runner.invoke(app, ["compile", str(corpus.source), "--tokenizer", str(corpus.spm), "--probe", "never",
                              "-o", str(tmp_path / "out.parquet")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "out.rejects.parquet"]


# the library checks its own options (whatever the caller), naming the field


@pytest.mark.parametrize("field,value", [
    ("world_size", 0), ("world_size", 2**20 + 1), ("world_size", True), ("world_size", 3.0), ("world_size", "3"),
    ("epochs", 0), ("epochs", 1.0), ("seed", -1), ("row_group_steps", 0), ("balance", -0.1),
    ("balance", float("nan")), ("balance", float("inf")), ("balance", "0.05"), ("strict", 1),
    ("interleave", "sideways"), ("sync_group", 3), ("sync_group", 0), ("carry", "yes"),
])
def test_plan_options_refuse(field: str, value: object) -> None:
    from dataprep.planning import PlanOptions
    from manifests.errors import OptionError

    with pytest.raises(OptionError) as info:
        PlanOptions(**{"world_size": 4, field: value})
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


def test_build_plan_checks_what_python_callers_pass(corpus: Corpus, tmp_path: Path) -> None:
    from dataprep.planning import build_plan
    from manifests.errors import DataprepError

    with pytest.raises(DataprepError, match="options must be PlanOptions"):
        build_plan(corpus.manifest, corpus.buckets, tmp_path / "p", {"world_size": 10**9})  # type: ignore[arg-type]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("field,value", [
    ("lr", 0), ("lr", float("nan")), ("lr", "1e-3"), ("steps", -1), ("steps", 2.0), ("workers", -1),
    ("workers", True), ("prefetch", "2"), ("checkpoint_every", -5), ("timeout_s", 0), ("device", "tpu"),
    ("seed", 2**64), ("tokenizer", []), ("tokenizer", "m.model"), ("resume", 1), ("model", ""),
])
def test_train_config_refuses(field: str, value: object) -> None:
    from dataprep.training_config import TrainConfig
    from manifests.errors import OptionError

    base = {"plan_dir": "plan", "manifest": "m.parquet", "tokenizer": ["t.model"], "checkpoint_dir": "ck"}
    with pytest.raises(OptionError) as info:
        TrainConfig(**{**base, field: value})
    assert info.value.field == field


@pytest.mark.parametrize("field,value", [
    ("max_batch", 0), ("max_batch", 2**20 + 1), ("max_batch", 64.0), ("memory_fraction", 0), ("memory_fraction", 1.01),
    ("tolerance", -0.1), ("max_tps", float("inf")), ("gpu_memory", "80GiB"), ("gpu_memory", 0), ("retries", -1),
    ("start_batch", 0), ("loss_mode", "fused"), ("margin", "lots"), ("estimate", "yes"),
])
def test_oom_options_refuse(field: str, value: object) -> None:
    from manifests.errors import OptionError
    from oom.options import OomOptions

    with pytest.raises(OptionError) as info:
        OomOptions(**{"model": "tiny", "estimate": True, "gpu_memory": 2**30, field: value})
    assert info.value.field == field


def test_oom_options_need_a_memory_size_without_a_gpu() -> None:
    from manifests.errors import OptionError
    from oom.options import OomOptions

    with pytest.raises(OptionError, match="gpu_memory: required"):
        OomOptions("tiny", estimate=True)
    assert OomOptions("tiny", device="cuda").gpu_memory is None  # a real GPU says its own


def test_cli_defaults_are_the_options_objects() -> None:
    """Each default lives once: the command's signature reads it from the options object."""
    import dataclasses
    import inspect

    from dataprep.cli.oom import oomptimize_cmd
    from dataprep.cli.plan import plan_batches_cmd
    from dataprep.cli.train import train_cmd
    from dataprep.planning import PlanOptions
    from dataprep.training_config import TrainConfig
    from oom.options import OomOptions

    renamed = {"timeout": "timeout_s"}
    for cmd, cls in [(train_cmd, TrainConfig), (plan_batches_cmd, PlanOptions), (oomptimize_cmd, OomOptions)]:
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        if cls in (PlanOptions, OomOptions):
            del fields["dynamic_resolution"]  # a DynResConfig built from the --dynamic-resolution flag and rates
        if cls is PlanOptions:
            del fields["cost_equal"]  # the flag's default is None: on with --cost-model, off without (tests/planning/test_calibrate.py)
        shared = 0
        for name, p in inspect.signature(cmd).parameters.items():
            field = renamed.get(name, name)
            if field in fields and fields[field] is not dataclasses.MISSING and p.default is not inspect.Parameter.empty:
                assert p.default == fields[field], (cls.__name__, name)
                shared += 1
        assert shared >= 5
    # the dynamic-resolution flags (plan-batches, oomptimize, padding) default to DynResConfig's
    from bucketing.dynres import DynResConfig
    from dataprep.cli.buckets import padding_cmd

    dyn = {f.name: f.default for f in dataclasses.fields(DynResConfig) if f.name != "sample_rate"}
    for cmd in (plan_batches_cmd, oomptimize_cmd, padding_cmd):
        params = inspect.signature(cmd).parameters
        assert {k: params[k].default for k in dyn} == dyn, cmd.__name__
