"""Numbers that overflow, sizes without bound and YAML that explodes (issue 44): every user float
of a weighted, balanced plan (weights, temperature, cost coefficients, epoch size) gives either
a one-line error before work starts or a plan ``verify`` accepts, never exit 0 with a plan the
tool's own readers refuse; the one YAML loader refuses alias cycles and alias explosions."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS
from dataprep.tokenize import train_model
from manifests.errors import DataprepError, ManifestError
from manifests.validation import MAX_YAML_NODES, load_json_file, load_yaml_file
from tests.compile.test_blend import _nemo
from tests.conftest import SLOW_EXAMPLES
from tests.hostile.conftest import refused
from tests.training._consumer import Corpus

runner = CliRunner()


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A compiled two-corpus blend (10 + 4 rows, weights 100 and 5 at temperature 0.5) and buckets."""
    root = tmp_path_factory.mktemp("numbers")
    _nemo(root, "big", 10, "en")
    _nemo(root, "small", 4, "en")
    train_model([" ".join(WORDS)] * 4, root / "spm.model", vocab_size=60, threads=1)
    cfg = {"reweight_temperature": 0.5, "input_cfg": [
        {"type": "nemo", "manifest_filepath": "big.json", "weight": 100.0},
        {"type": "nemo", "manifest_filepath": "small.json", "weight": 5.0}]}
    (root / "input_cfg.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    res = runner.invoke(app, ["compile", str(root / "input_cfg.yaml"), "--tokenizer", str(root / "spm.model"),
                              "-o", str(root / "m.parquet")])
    assert res.exit_code == 0, res.output
    buckets = root / "buckets.json"
    buckets.write_text(json.dumps({"version": 1, "buckets": [{"index": 0, "max_duration": 0.75, "batch_size": 3},
                                                             {"index": 1, "max_duration": 2.0, "batch_size": 2}]}))
    return root / "m.parquet", buckets


def _plan(blend: tuple[Path, Path], out: Path, *extra: str):
    manifest, buckets = blend
    return runner.invoke(app, ["plan-batches", str(manifest), "-b", str(buckets), "-w", "1", "-o", str(out), *extra])


def _one_line_or_valid(res, out: Path, detail: str) -> None:
    """Exit 2 with one ``error:`` line, or exit 0 with a plan ``verify`` and the strict JSON reader accept."""
    detail = f"{detail} -> {res.exit_code}\n{res.output}\n{res.exception!r}"
    assert res.exit_code in (0, 2), detail
    assert res.exception is None or isinstance(res.exception, SystemExit), detail
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), detail
        return
    load_json_file(out / "plan.json")  # no NaN / Infinity
    check = runner.invoke(app, ["verify", str(out)])
    assert check.exit_code == 0, f"{detail}\nverify: {check.output}"


EXTREME = st.sampled_from([0.0, 5e-324, 1e-308, 1e-300, 1e-12, 0.5, 1.0, 3.0, 400.0, 1e12, 1e300, 1e308,
                           1.7976931348623157e308]) | st.floats(min_value=0, allow_nan=False, allow_infinity=False)


def _fmt(x: float) -> str:
    return repr(x)


@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_extreme_floats_give_one_line_or_a_plan_verify_accepts(blend: tuple[Path, Path],
                                                                 tmp_path_factory: pytest.TempPathFactory,
                                                                 data: st.DataObject) -> None:
    args: list[str] = []
    if data.draw(st.booleans(), "weights"):
        args += ["--weights", f"big={_fmt(data.draw(EXTREME))}", "--weights", f"small={_fmt(data.draw(EXTREME))}"]
    if data.draw(st.booleans(), "temperature"):
        args += ["--temperature", _fmt(data.draw(EXTREME))]
    for name in data.draw(st.lists(st.sampled_from(["overhead", "per_frame", "per_frame2", "per_token",
                                                    "per_token2", "frame_shift"]), max_size=3, unique=True)):
        args += ["--coef", f"{name}={_fmt(data.draw(EXTREME))}"]
    size = data.draw(st.sampled_from(["", "--epoch-utterances", "--epoch-hours"]))
    if size == "--epoch-utterances":
        args += [size, str(data.draw(st.sampled_from([1, 7, 10**4, 10**9, 2**40, 2**62])))]
    elif size:
        args += [size, _fmt(data.draw(EXTREME))]
    if not args:
        args = ["--temperature", "1e300"]
    out = tmp_path_factory.mktemp("plan") / "p"
    _one_line_or_valid(_plan(blend, out, *args), out, " ".join(args))


@pytest.mark.parametrize("args", [
    ["--coef", "overhead=1e308"],  # step times overflow: idle / straggler were NaN in plan.json
    ["--coef", "per_token2=1e308"],
    ["--coef", "frame_shift=5e-324"],
    ["--coef", "overhead=0", "--coef", "per_frame=0", "--coef", "per_frame2=0", "--coef", "per_token=0",
     "--coef", "per_token2=0"],  # every step 0 s: 0 / 0
])
def test_cost_coefficients_that_overflow_are_refused_before_work(blend: tuple[Path, Path], tmp_path: Path,
                                                                 args: list[str]) -> None:
    manifest, buckets = blend
    refused("plan-batches", manifest, "-b", buckets, "-w", "1", "-o", tmp_path / "p", *args,
            match="cost coefficient")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("args", [
    ["--temperature", "400"],  # w^T overflows: was an IndexError traceback
    ["--temperature", "1e300"],
    ["--weights", "big=1e308", "--weights", "small=1e308"],  # the sum overflows: was "0 utterances"
    ["--weights", "big=1e300", "--weights", "small=1e-300", "--epoch-utterances", "100"],
])
def test_weights_and_temperatures_that_overflow_give_a_valid_plan(blend: tuple[Path, Path], tmp_path: Path,
                                                                 args: list[str]) -> None:
    res = _plan(blend, tmp_path / "p", *args)
    assert res.exit_code == 0, res.output
    _one_line_or_valid(res, tmp_path / "p", " ".join(args))
    corpora = json.loads((tmp_path / "p" / "plan.json").read_text())["weights"]["corpora"]
    assert all(math.isfinite(c["probability"]) for c in corpora)


@pytest.mark.parametrize("args,match", [
    (["--epoch-utterances", str(10**11)], ("--epoch-utterances", "1024 times the 14 rows")),
    (["--epoch-hours", "1e12"], ("--epoch-hours", "utterances per epoch, more than")),
    (["--epoch-hours", "1e300"], ("--epoch-hours",)),
    (["--epoch-utterances", str(10**7), "--weights", "big=1", "--weights", "small=1e9"],
     ("--epoch-utterances",)),  # 14336 at most
])
def test_epoch_sizes_far_beyond_the_corpus_are_refused_before_allocating(blend: tuple[Path, Path], tmp_path: Path,
                                                                         args: list[str], match: tuple) -> None:
    manifest, buckets = blend
    start = time.perf_counter()
    refused("plan-batches", manifest, "-b", buckets, "-w", "1", "-o", tmp_path / "p", *args, match=match)
    assert time.perf_counter() - start < 30


def test_a_row_repeated_past_the_bound_is_refused(blend: tuple[Path, Path]) -> None:
    """One row against 3 million within the epoch bound (1024x the rows) would be taken 1.5 billion
    times an epoch: past int32, refused by name."""
    import numpy as np

    from dataprep.planning import PlanOptions
    from dataprep.planning.weights import MAX_REPEATS, Blend, weighting

    manifest, _ = blend
    tree = {"children": [{"weight": 1.0, "corpus": "big"}, {"weight": 1.0, "corpus": "small"}]}
    rows = np.asarray([3_000_000, 1], dtype=np.int64)
    opts = PlanOptions(world_size=1, epoch_utterances=1024 * 3_000_000)
    with pytest.raises(DataprepError, match=f"'small'.*1536000000 times an epoch.*more than {MAX_REPEATS}"):
        weighting(manifest, Blend("options", tree, {"big": 0.5, "small": 0.5}), rows, rows * 10**6, opts)
    assert MAX_REPEATS < 2**31  # times are counted in int32 per row


def test_simulate_refuses_out_of_range_factors_before_simulating(blend: tuple[Path, Path], tmp_path: Path) -> None:
    assert _plan(blend, tmp_path / "p").exit_code == 0
    for args in (["--slow-rank", "0=1e308", "--strategy", "adpsgd"], ["--exchange", "1e308"]):
        res = runner.invoke(app, ["simulate", str(tmp_path / "p"), *args])
        assert res.exit_code == 2 and "tail-worker" not in res.stdout, res.output  # nothing printed first


# --- YAML ---------------------------------------------------------------------------------------

def _laughs(levels: int) -> str:
    lines = ["l0: &l0 {lang: en}"]
    lines += [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}, *l{i - 1}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_yaml_alias_cycles_are_refused(tmp_path: Path) -> None:
    for text in ("a: &a [*a]\n", "input_cfg: &a\n  - type: group\n    input_cfg: *a\n", "&r {x: *r}\n"):
        p = tmp_path / "c.yaml"
        p.write_text(text)
        with pytest.raises(ManifestError, match="a cycle"):
            load_yaml_file(p)


def test_yaml_alias_explosions_are_refused_quickly(tmp_path: Path) -> None:
    p = tmp_path / "laughs.yaml"
    p.write_text(_laughs(40))  # 4**40 nodes once expanded
    start = time.perf_counter()
    with pytest.raises(ManifestError, match="expand to more than"):
        load_yaml_file(p)
    assert time.perf_counter() - start < 5
    p.write_text(_laughs(6))  # ~5,500 nodes: shared sub-trees within the budget load
    assert len(load_yaml_file(p)["l6"]) == 4 and 4**6 < MAX_YAML_NODES


def test_every_yaml_reader_uses_the_guarded_loader(blend: tuple[Path, Path], tmp_path: Path) -> None:
    """The blend reader (compile) and the bucketing YAML (plan-batches -b) refuse both, one line."""
    manifest, _ = blend
    spm = manifest.parent / "spm.model"
    cyc = tmp_path / "cfg.yaml"
    cyc.write_text("input_cfg: &a\n  - type: group\n    weight: 1\n    input_cfg: *a\n")
    refused("compile", cyc, "--tokenizer", spm, "-o", tmp_path / "x.parquet", match=(str(cyc), "cycle"))
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(_laughs(30) + "input_cfg: [{type: nemo, manifest_filepath: big.json, tags: *l30}]\n")
    refused("compile", laughs, "--tokenizer", spm, "-o", tmp_path / "x.parquet", match=(str(laughs), "expand"))
    bk = tmp_path / "bucketing.yaml"
    bk.write_text("bucket_duration_bins: [1, 2]\nbucket_batch_size: &c [4, *c]\n")
    refused("plan-batches", manifest, "-b", bk, "-w", "1", "-o", tmp_path / "p", match=(str(bk), "cycle"))
    ok = tmp_path / "shared.yaml"  # an ordinary alias still works
    ok.write_text("common: &t {lang: en}\ninput_cfg:\n  - {type: nemo, manifest_filepath: "
                  f"{manifest.parent / 'big.json'}, weight: 1, tags: *t}}\n")
    res = runner.invoke(app, ["compile", str(ok), "--tokenizer", str(spm), "-o", str(tmp_path / "y.parquet")])
    assert res.exit_code == 0, res.output


# --- options that need another, formats by suffix ------------------------------------------------

@pytest.mark.parametrize("cmd,args,match", [
    ("plan-batches", ["--target-frames", "1000"], "--target-frames: only matters with --dynamic-resolution"),
    ("plan-batches", ["--min-rate", "60"], "--min-rate: only matters with --dynamic-resolution"),
    ("simulate", ["--group-size", "2"], "--group-size: only matters with --strategy hybrid"),
    ("simulate", ["--slow-rank", "0=2"], "--slow-rank: only matters with --strategy"),
    ("simulate", ["--strategy", "sync", "--exchange", "0.1"], "--exchange: only matters with --strategy adpsgd"),
    ("padding", ["--balance", "0.2"], "--balance: only matters with --world-sizes"),
    ("plan-batches", ["--sequences-per-batch", "2"], "--sequences-per-batch: only matters with --pack"),
    ("padding", ["--audio-token-rate", "25"], "--audio-token-rate: only matters with --pack"),
    ("oomptimize", ["--exact-trace"], "--exact-trace: only matters with --estimate"),
    ("oomptimize", ["--estimate", "--frames-per-second", "50"], "--frames-per-second: only matters with"),
])
def test_an_option_without_its_enabling_flag_is_refused(blend: tuple[Path, Path], tmp_path: Path, cmd: str,
                                                        args: list[str], match: str) -> None:
    manifest, buckets = blend
    plan = tmp_path / "plan"
    if cmd == "simulate":
        assert _plan(blend, plan).exit_code == 0
    base = {"plan-batches": [manifest, "-b", buckets, "-w", "1", "-o", tmp_path / "p"],
            "simulate": [plan],
            "padding": [manifest, "--buckets", buckets],
            "oomptimize": [buckets, "--model", "tiny", "--gpu-memory", "8GiB", "-o", tmp_path / "o.json"]}[cmd]
    refused(cmd, *base, *args, match=match)


def test_the_buckets_format_follows_the_suffix_every_reader_uses(blend: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _, buckets = blend
    base = ["oomptimize", buckets, "--model", "tiny", "--estimate", "--gpu-memory", "8GiB"]
    refused(*base, "--format", "nemo", "-o", tmp_path / "o.json", match=("--format", "'o.json'"))
    refused(*base, "--format", "json", "-o", tmp_path / "o.yaml", match=("--format", "'o.yaml'"))
    res = runner.invoke(app, [str(a) for a in (*base, "-o", tmp_path / "o.yaml")])  # NeMo YAML, by its suffix
    assert res.exit_code == 0, res.output
    assert "bucket_duration_bins" in yaml.safe_load((tmp_path / "o.yaml").read_text())
    manifest, _ = blend
    plan = runner.invoke(app, ["plan-batches", str(manifest), "-b", str(tmp_path / "o.yaml"), "-w", "1", "-o",
                               str(tmp_path / "p")])
    assert plan.exit_code == 0, plan.output
    refused("fit-buckets", manifest, "-o", tmp_path / "b.yaml", match=("b.yaml", "name it .json"))


# --- missing columns, rejects files, sizes and their hints --------------------------------------

def _without(manifest: Path, column: str, out: Path) -> Path:
    """``manifest`` less ``column``, written (with its content hash) as the tool writes manifests."""
    import pyarrow.parquet as pq

    from manifests.manifest_read import read_metadata
    from manifests.manifest_write import write_parquet_stream

    t = pq.read_table(manifest).drop([column]).replace_schema_metadata(None)
    write_parquet_stream(lambda: [t], out, t.schema, "manifest", read_metadata(manifest)["provenance"])
    return out


def test_a_missing_tps_is_computed_and_a_missing_underivable_column_refused(blend: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    from manifests.manifest_read import read_manifest

    manifest, buckets = blend
    no_tps = _without(manifest, "tps", tmp_path / "no_tps.parquet")
    for name, m in (("a", manifest), ("b", no_tps)):
        res = runner.invoke(app, ["stats", str(m), "--json", str(tmp_path / f"{name}.json")])
        assert res.exit_code == 0, res.output
        res = runner.invoke(app, ["filter", str(m), "--max-tps", "9", "-o", str(tmp_path / f"{name}.parquet"),
                                  "--rejects", str(tmp_path / f"{name}.rej.parquet")])
        assert res.exit_code == 0, res.output
    stats = [json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"]
    assert [{k: v for k, v in s.items() if k != "manifest"} for s in stats][0] == \
           [{k: v for k, v in s.items() if k != "manifest"} for s in stats][1]
    assert read_manifest(tmp_path / "a.parquet").equals(read_manifest(tmp_path / "b.parquet"))  # tps = tokens / s
    no_tokens = _without(manifest, "num_tokens", tmp_path / "no_tokens.parquet")
    refused("stats", no_tokens, match=(str(no_tokens), "lacks column(s) num_tokens"))


def test_filter_names_the_manifest_lacking_a_column_a_filter_needs(corpus: Corpus, tmp_path: Path) -> None:
    """A one-corpus manifest (no ``corpus`` column: the filter's column pass is skipped)."""
    no_duration = _without(corpus.manifest, "duration", tmp_path / "no_duration.parquet")
    refused("filter", no_duration, "--max-duration", "20", "-o", tmp_path / "f.parquet",
            match=(str(no_duration), "lacks column(s) duration"))


@pytest.mark.parametrize("kind", ["nemo", "lhotse"])
def test_export_refuses_a_rejects_file(blend: tuple[Path, Path], tmp_path: Path, kind: str) -> None:
    manifest, buckets = blend
    rejects = manifest.with_name("m.rejects.parquet")  # compile's
    assert rejects.is_file()
    refused("export", kind, buckets, "-m", rejects, "-o", tmp_path / "ex", match=(str(rejects), "rejects file"))


@pytest.mark.parametrize("value,match", [
    ("50%", None),  # of the machine's memory, as the hint for a bad size says
    ("abc", "e.g. 80GiB, 40GB, 5%"), ("inf%", "(0, 100]"), ("nan%", "(0, 100]"), ("150%", "(0, 100]"),
    ("9" * 400 + "GiB", "too large"),
])
def test_memory_sizes_parse_the_grammar_their_hints_show(blend: tuple[Path, Path], tmp_path: Path, value: str,
                                                         match: str | None) -> None:
    manifest, buckets = blend
    args = ["plan-batches", manifest, "-b", buckets, "-w", "1", "-o", tmp_path / "p", "--memory-limit", value]
    if match is None:
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, res.output
    else:
        refused(*args, match=("--memory-limit", match))


def test_a_size_without_a_total_neither_takes_nor_suggests_a_percentage(blend: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    _, buckets = blend
    base = ["oomptimize", buckets, "--model", "tiny", "--estimate", "-o", tmp_path / "o.json"]
    line = refused(*base, "--gpu-memory", "lots", match=("--gpu-memory", "e.g. 80GiB"))
    assert "%" not in line
    refused(*base, "--gpu-memory", "50%", match=("--gpu-memory", "not accepted here"))
