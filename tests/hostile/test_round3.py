"""Hostile input, round three (issue 24): sizes with no upper bound (class 3), re-planned and
edited plans (class 5), library inputs never coerced (class 6), output paths and odd sources
(class 7). Each case: one-line error and exit 2 (or DataprepError from the library), or the
exact correct result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketing.dynres import DynResConfig
from dataprep.planning import PlanOptions, build_plan, simulate_plan
from dataprep.planning.simulate import simulate_strategies
from dataprep.tokenize import train_model
from manifests.containers import MAX_BRACE_PATHS, expand_braces
from manifests.errors import DataprepError, OptionError
from manifests.plan_meta import read_plan_meta
from tests.hostile.conftest import refused
from tests.training._consumer import Corpus, invoke

# --- class 3: sizes ----------------------------------------------------------------------------


@pytest.mark.parametrize("w", [18, 1000, 2**20, 2**20 + 1, 10**9])
def test_world_size_above_the_rows_is_refused_before_any_shard(corpus: Corpus, plan: Path, tmp_path: Path, w: int) -> None:
    rows = pq.ParquetFile(corpus.manifest).metadata.num_rows
    assert w > rows
    line = refused("plan-batches", corpus.manifest, "-b", corpus.buckets, "-w", w, "-o", tmp_path / "p",
                   "--sync-group", 1, "--epochs", 1000, match="--world-size")
    assert "number of rows" in line or "<= 1048576" in line
    refused("replan", plan, "--at-step", 1, "-w", w, "-o", tmp_path / "r", "--manifest", corpus.manifest,
            match="--world-size")
    assert list(tmp_path.iterdir()) == []  # no plan folder, no temporary folder of shards


def test_world_size_check_is_in_the_library(corpus: Corpus, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="world_size: must be <= the number of rows"):
        build_plan(corpus.manifest, corpus.buckets, tmp_path / "p", PlanOptions(world_size=500))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("pattern,match", [
    ("a_{0..999999999}.tar", f"more than {MAX_BRACE_PATHS} paths"),
    ("a__OP_0..99999_CL_.tar", "holds only"),
    ("a_{0..2000}_{0..2000}.tar", f"more than {MAX_BRACE_PATHS} paths"),
    ("a_{0..5}.tar", "holds only"),  # 6 names in a folder of 2 entries
])
def test_brace_ranges_are_counted_before_expansion(tmp_path: Path, pattern: str, match: str) -> None:
    (tmp_path / "a_0.tar").write_bytes(b"")
    (tmp_path / "a_1.tar").write_bytes(b"")
    with pytest.raises(DataprepError, match=match):
        expand_braces(str(tmp_path / pattern))
    assert expand_braces(str(tmp_path / "a_{0..1}.tar")) == [str(tmp_path / "a_0.tar"), str(tmp_path / "a_1.tar")]


def test_brace_range_through_compile(corpus: Corpus, tmp_path: Path) -> None:
    man = tmp_path / "manifest_0.json"
    man.write_text(json.dumps({"audio_filepath": "a.wav", "duration": 1.0, "text": "a", "shard_id": 0}) + "\n")
    refused("compile", man, "--tokenizer", corpus.spm, "-o", tmp_path / "o.parquet",
            "--tarred-audio", str(tmp_path / "audio__OP_0..999999999_CL_.tar"), match="paths")


@pytest.mark.parametrize("args,match", [
    (["--world-sizes", "1000000000"], "--world-sizes: must be <= 1048576"),
    (["--strategy", "hybrid", "--group-size", "10000000000"], "--group-size"),
    (["--strategy", "sync", "--slow-rank", "0=1e300"], "--slow-rank: must be <= "),
    (["--strategy", "sync", "--slow-rank", "7=2"], "--slow-rank"),  # not a rank of the plan
    (["--epoch", "3"], "--epoch: the plan has epochs 0..0"),
])
def test_simulate_sizes(plan: Path, args: list[str], match: str) -> None:
    refused("simulate", plan, *args, match=match)


# --- class 4 (library side; the CLI side is test_floats.py) -------------------------------------

@given(value=st.floats(allow_nan=True, allow_infinity=True), field=st.sampled_from(
    ["frames_per_second", "min_rate", "max_rate", "floor_rate"]))
@settings(max_examples=80, deadline=None)
def test_dynres_config_is_finite_and_ordered(value: float, field: str) -> None:
    try:
        cfg = DynResConfig(**{field: value})
    except ValueError as exc:  # OptionError is one
        assert "\n" not in str(exc)
    else:
        assert 0 < cfg.floor_rate <= cfg.min_rate <= cfg.max_rate <= cfg.sample_rate
        assert 0 < cfg.frames_per_second <= cfg.sample_rate


@pytest.mark.parametrize("kwargs,field", [
    ({"slow": {0: float("inf")}}, "slow"), ({"slow": {0: float("nan")}}, "slow"), ({"slow": {True: 2.0}}, "slow"),
    ({"slow": {"0": 2.0}}, "slow"), ({"exchange": float("nan")}, "exchange"), ({"exchange": -1.0}, "exchange"),
    ({"group_size": 1.5}, "group_size"), ({"epoch": "0"}, "epoch"), ({"epoch": True}, "epoch"),
])
def test_simulate_library_checks(plan: Path, kwargs: dict, field: str) -> None:
    with pytest.raises(OptionError, match=f"^{field}: "):
        simulate_strategies(plan, ["sync"], **kwargs)


@pytest.mark.parametrize("kwargs,field", [({"world_sizes": [2.0]}, "world_sizes"), ({"world_sizes": [True]}, "world_sizes"),
                                          ({"seed": "1"}, "seed"), ({"epoch": -1}, "epoch")])
def test_simulate_plan_library_checks(plan: Path, kwargs: dict, field: str) -> None:
    with pytest.raises(OptionError, match=f"^{field}: "):
        simulate_plan(plan, **kwargs)


# --- class 5: re-planned and edited plans -------------------------------------------------------

@pytest.fixture(scope="module")
def replanned(corpus: Corpus, plan: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rp") / "plan2"
    invoke("replan", str(plan), "--at-step", "1", "-w", "2", "-o", str(out), "--manifest", str(corpus.manifest))
    return out


def test_verify_accepts_an_untouched_replanned_plan(corpus: Corpus, replanned: Path) -> None:
    out = invoke("verify", str(replanned), "--manifest", str(corpus.manifest))
    assert "ok" in out and "manifest ok" in out
    invoke("simulate", str(replanned), "--world-sizes", "2")


def test_a_replanned_plan_replans_again(corpus: Corpus, replanned: Path, tmp_path: Path) -> None:
    meta = read_plan_meta(replanned)
    invoke("replan", str(replanned), "--at-step", str(meta.first_step + 1), "-w", "1", "-o", str(tmp_path / "p3"),
           "--manifest", str(corpus.manifest))
    invoke("verify", str(tmp_path / "p3"))
    refused("replan", replanned, "--at-step", 0, "-w", 1, "-o", tmp_path / "p4", "--manifest", corpus.manifest,
            match="--at-step 0")


@pytest.mark.parametrize("edit", [
    lambda p: p.update(seed=p["seed"] + 1),
    lambda p: p.update(steps_per_epoch=[p["num_steps"] - 1], num_steps=p["num_steps"] - 1),
    lambda p: p["replan"].update(at_step=p["replan"]["at_step"] + 1),
    lambda p: p["allocation"].update(strict=not p["allocation"].get("strict", False)),
])
def test_every_reader_refuses_an_edited_plan(corpus: Corpus, replanned: Path, tmp_path: Path, edit) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(replanned, plan)
    obj = json.loads((plan / "plan.json").read_text())
    edit(obj)
    (plan / "plan.json").write_text(json.dumps(obj))
    for args in (["verify", plan], ["simulate", plan],
                 ["replan", plan, "--at-step", read_plan_meta(replanned).first_step, "-w", 1, "-o", tmp_path / "x",
                  "--manifest", corpus.manifest],
                 ["export", "nemo", plan, "--manifest", corpus.manifest, "-o", tmp_path / "e"]):
        refused(*args, match="plan_hash: differs")
    assert not (tmp_path / "x").exists() and not (tmp_path / "e").exists()


# --- class 6: library inputs --------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,field", [({"model_type": "bogus"}, "model_type"), ({"vocab_size": 30.0}, "vocab_size"),
                                          ({"vocab_size": "30"}, "vocab_size"), ({"threads": True}, "threads"),
                                          ({"character_coverage": float("nan")}, "character_coverage")])
def test_train_model_checks_its_arguments(tmp_path: Path, kwargs: dict, field: str) -> None:
    with pytest.raises(OptionError, match=f"^{field}: "):
        train_model(["a b c"] * 10, tmp_path / "m.model", **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cfg,match", [({"seed": "5"}, "config: seed"), ({"seed": True}, "config: seed"),
                                       ({"seed": 1.0}, "config: seed"), ({"num_workers": 1.5}, "config: num_workers"),
                                       ({"sample_rate": "16000"}, "config: sample_rate"),
                                       ({"pin_memory": "yes"}, "config: pin_memory"),
                                       ({"force_iterable_dataset": 1}, "config: force_iterable_dataset"),
                                       ({"channel_selector": True}, "config: channel_selector: must be an integer"),
                                       ({"channel_selector": -1}, "config: channel_selector: must be >= 0")])
def test_nemo_config_values_are_not_coerced(corpus: Corpus, plan: Path, cfg: dict, match: str) -> None:
    pytest.importorskip("lhotse")
    from dataprep.integrations.nemo import get_plan_dataloader

    with pytest.raises(DataprepError, match=match):
        get_plan_dataloader({"plan_dir": str(plan), "manifest": str(corpus.manifest), **cfg}, 0, 1, None)


# --- class 7: output paths and odd sources -------------------------------------------------------

def test_file_outputs_that_are_directories(corpus: Corpus, tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    refused("compile", corpus.source, "--tokenizer", corpus.spm, "-o", d, match="is an existing directory")
    refused("compile", corpus.source, "--tokenizer", corpus.spm, "-o", tmp_path / "m.parquet", "--rejects", d,
            match="--rejects: is an existing directory")
    refused("fit-buckets", corpus.manifest, "-o", d, match="is an existing directory")
    refused("train-tokenizer", corpus.source, "-o", d, "--vocab-size", 30, match="is an existing directory")
    refused("train-tokenizer", corpus.source, "-o", tmp_path / "x.model", "--model-type", "bogus",
            match="--model-type: must be unigram, bpe, char or word")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and list(d.iterdir()) == []


def test_duplicated_header_column(corpus: Corpus, tmp_path: Path) -> None:
    rows = [json.loads(x) for x in corpus.source.read_text().splitlines()][:3]
    csv = tmp_path / "dup.csv"
    csv.write_text("audio_filepath,text,duration,text\n" + "".join(f"{r['audio_filepath']},a,{r['duration']},b\n" for r in rows))
    refused("compile", csv, "--tokenizer", corpus.spm, "-o", tmp_path / "o.parquet", match="column 'text' appears twice")
    tsv = tmp_path / "dup.tsv"
    tsv.write_text("duration\taudio_filepath\ttext\tduration\n" + "".join(f"1\t{r['audio_filepath']}\ta\t2\n" for r in rows))
    refused("compile", tsv, "--tokenizer", corpus.spm, "-o", tmp_path / "o.parquet", match="column 'duration' appears twice")


def test_parquet_binary_columns(corpus: Corpus, tmp_path: Path) -> None:
    rows = [json.loads(x) for x in corpus.source.read_text().splitlines()][:3]
    src = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"audio_filepath": [r["audio_filepath"] for r in rows],
                             "text": pa.array([b"abc", b"\xff\xfe", b"x"], pa.binary()),
                             "duration": [r["duration"] for r in rows],
                             "blob": pa.array([b"\x00\xff", None, b""], pa.binary())}), src)
    invoke("compile", str(src), "--tokenizer", str(corpus.spm), "-o", str(tmp_path / "o.parquet"))
    rej = pq.read_table(tmp_path / "o.rejects.parquet").to_pylist()
    assert [r["reason"] for r in rej] == ["malformed_line"] * 3 and "not a string (got BINARY)" in rej[0]["detail"]
    assert json.loads(rej[0]["extra"]) == {"blob": "AP8="}  # unmapped bytes kept, as base64


def test_rejects_file_given_as_a_manifest(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    rejects = corpus.manifest.with_name("kept.rejects.parquet")
    refused("export", "nemo", plan, "--manifest", rejects, "-o", tmp_path / "e")
    refused("plan-batches", rejects, "-b", corpus.buckets, "-w", 1, "-o", tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(w=st.integers(min_value=-2, max_value=2**40))
def test_any_world_size(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory, w: int) -> None:
    """Random sizes: a plan (w <= rows) or one line, never an allocation proportional to w."""
    out = tmp_path_factory.mktemp("w") / "p"
    rows = pq.ParquetFile(corpus.manifest).metadata.num_rows
    if 1 <= w <= rows:
        return  # planned for real elsewhere (a plan of w ranks is correct or one line, test_plan_cli)
    refused("plan-batches", corpus.manifest, "-b", corpus.buckets, "-w", w, "-o", out, match="--world-size")


@pytest.mark.parametrize("args,match", [(["--window", "100000000000"], "--window: must be <="),
                                        (["--window", "18"], "--window: must be <= the number of rows"),
                                        (["--world-sizes", "1000000000"], "--world-sizes: must be <="),
                                        (["--world-sizes", "2,18"], "--world-sizes: must be <= the number of rows")])
def test_padding_sizes_bounded_by_the_manifest(corpus: Corpus, args: list[str], match: str) -> None:
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, *args, match=match)
