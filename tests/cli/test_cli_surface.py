"""The command line as a user meets it: a missing extra or device is one line naming the fix,
``--version``, figures never cut off a terminal, and one name / short option / default for one
idea across commands (``--help`` in pipeline order, no ``<bool>`` for flags, plurals, no -0.0%).

Missing modules are made unimportable in a real subprocess (``sys.modules[name] = None``, as
Python does for a package that is not installed); CUDA is tested where it is absent."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import typer.main
from rich.console import Console
from typer.testing import CliRunner

import dataprep
from dataprep.cli import app
from dataprep.cli.app import PIPELINE_ORDER
from dataprep.cli.fmt import Table, pct, plural
from manifests.optional import INSTALL
from oom.options import MODEL_NAMES
from tests.training._consumer import Corpus, build_corpus
from tests.warm_python import run_python

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("surface"), num_tones=16, shared_limit=0)


@pytest.fixture(scope="module")
def plan(corpus: Corpus) -> Path:
    return corpus.plan(1)


#: what the CLI's modules import from other packages, imported once by the server the commands are
#: forked from (:mod:`tests.warm_python`); never the CLI itself, whose consoles read FORCE_COLOR and
#: COLUMNS when they are built, nor a module a test makes missing
THIRD_PARTY = ("numpy", "polars", "pyarrow", "rich", "typer")


def _run(*args: object, missing: tuple[str, ...] = (), env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``dataprep ARGS`` in a process of its own that imported only :data:`THIRD_PARTY`, stdout
    and stderr not a terminal, no COLUMNS (unless ``env`` sets it); each module of ``missing``
    unimportable there, as if not installed."""
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in missing)
            + "from dataprep.cli import app\napp(args=sys.argv[1:], prog_name='dataprep')\n")
    env = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")},
           **(env or {})}
    env["PYTHONPATH"] = str(REPO) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return run_python(["-c", code, *map(str, args)], env=env, timeout=300, preload=THIRD_PARTY)


def _one_line_error(res: subprocess.CompletedProcess[str], *fragments: str) -> str:
    detail = f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    assert res.returncode == 2, detail
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), detail
    assert "Traceback" not in res.stderr + res.stdout, detail
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]


# ---------------------------------------------------------------- missing extras and devices

@pytest.mark.parametrize("modules,extra,args", [
    (("lhotse",), "lhotse", lambda c, p, t: ["export", "lhotse", p, "-m", c.manifest, "-o", t / "out"]),
    (("torch",), "torch", lambda c, p, t: ["oomptimize", c.buckets, "--model", "tiny", "--estimate",
                                           "--gpu-memory", "1GiB", "-o", t / "sized.json"]),
    (("torch",), "torch", lambda c, p, t: ["train", p, "-m", c.manifest, "--tokenizer", c.spm,
                                           "--checkpoint-dir", t / "ck"]),
    (("matplotlib",), "plots", lambda c, p, t: ["stats", c.manifest, "--plots", t / "plots"]),
    (("altair", "vl_convert"), "report", lambda c, p, t: ["report", c.manifest, "-o", t / "r.html"]),
    (("ray",), "ray", lambda c, p, t: ["compile", c.source, "--tokenizer", c.spm, "-o", t / "m.parquet",
                                       "--executor", "ray"]),
], ids=["export-lhotse", "oomptimize", "train", "stats-plots", "report", "compile-ray"])
def test_a_missing_extra_is_one_line_naming_it(corpus: Corpus, plan: Path, tmp_path: Path, modules: tuple[str, ...],
                                              extra: str, args: object) -> None:
    res = _run(*args(corpus, plan, tmp_path), missing=modules)  # type: ignore[operator]
    _one_line_error(res, f"pip install 'speech-dataprep[{extra}]'", "not installed")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_every_extra_named_is_declared() -> None:
    """Each ``speech-dataprep[X]`` an error names is an extra of pyproject.toml."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {m.group(1) for cmd in INSTALL.values() for m in [re.search(r"speech-dataprep\[(\w+)\]", cmd)] if m}
    assert named and named <= set(extras), named - set(extras)


def test_a_missing_module_deep_in_a_call_is_the_same_line(corpus: Corpus, tmp_path: Path) -> None:
    """A submodule found missing inside a command (not at its start) still comes out as one line."""
    res = _run("stats", corpus.manifest, "--plots", tmp_path / "plots", missing=("matplotlib.figure",))
    _one_line_error(res, "pip install 'speech-dataprep[plots]'")


def _skip_where_cuda() -> None:
    if pytest.importorskip("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")


def test_oomptimize_on_cuda_without_cuda_is_one_line(corpus: Corpus, tmp_path: Path) -> None:
    _skip_where_cuda()
    res = runner.invoke(app, ["oomptimize", str(corpus.buckets), "--model", "tiny", "--device", "cuda",
                              "-o", str(tmp_path / "sized.json")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --device: cuda: "), res.stderr
    assert "--estimate --gpu-memory" in lines[0]
    assert not (tmp_path / "sized.json").exists()


def test_train_on_cuda_without_cuda_is_one_line(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    _skip_where_cuda()
    res = runner.invoke(app, ["train", str(plan), "-m", str(corpus.manifest), "--tokenizer", str(corpus.spm),
                              "--checkpoint-dir", str(tmp_path / "ck"), "--device", "cuda"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --device: cuda: ") and "--device cpu" in lines[0], res.stderr


# ---------------------------------------------------------------- --version

def test_version_is_the_package_metadata() -> None:
    res = _run("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"speech-dataprep {importlib.metadata.version('speech-dataprep')}"
    assert importlib.metadata.version("speech-dataprep") == dataprep.__version__


# ---------------------------------------------------------------- logs never cut a figure

def test_tables_through_a_pipe_keep_every_figure(corpus: Corpus, tmp_path: Path) -> None:
    """``padding --world-sizes`` off a terminal (a pipe, no COLUMNS): no cell cut, every figure whole."""
    js = tmp_path / "padding.json"
    res = _run("padding", corpus.manifest, "-b", corpus.buckets, "--world-sizes", "2,4,8", "--json", js)
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout
    report = json.loads(js.read_text())
    for r in report["steps"]:
        row = re.search(rf"│\s+{r['world_size']} │\s+{r['balance']:g} │.*", res.stdout)
        assert row is not None, res.stdout
        for figure in (f"{r['fill']:.3f}", f"{r['straggler']:.1%}", f"{r['padding_audio']:.2%}",
                       f"{r['padding_tokens']:.2%}"):
            assert figure in row.group(0), (figure, row.group(0))
    stats = _run("stats", corpus.manifest, env={"FORCE_COLOR": "1", "COLUMNS": "60"})  # CI forcing colours
    assert stats.returncode == 0 and "…" not in stats.stdout, stats.stdout


def test_a_narrow_terminal_folds_a_cell_rather_than_cutting_it() -> None:
    table = Table(title="t")
    for col in ("scheme", "utterances", "hours", "audio padding"):
        table.add_column(col, justify="right")
    table.add_row("2d-dynamic-resolution", "1,499,123,456", "12,345.67", "12.34%")
    console = Console(width=30, force_terminal=True, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    assert "…" not in text
    cells = [line.split("│") for line in text.splitlines() if line.startswith("│")]
    assert ["".join(c[i].strip() for c in cells) for i in (1, 2, 3, 4)] == \
        ["2d-dynamic-resolution", "1,499,123,456", "12,345.67", "12.34%"]


# ---------------------------------------------------------------- one name, one default

def _commands() -> dict[str, object]:
    """Every command by its path (``export lhotse``)."""
    found: dict[str, object] = {}

    def walk(cmd: object, path: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, path + [name])
        if not hasattr(cmd, "commands"):
            found[" ".join(path)] = cmd

    walk(typer.main.get_command(app), [])
    return found


def test_help_lists_the_commands_in_pipeline_order() -> None:
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    listed = [m.group(1) for m in re.finditer(r"^│ ([a-z-]+)\s", res.output, re.MULTILINE)
              if m.group(1) in PIPELINE_ORDER]
    assert listed == list(PIPELINE_ORDER)
    assert set(typer.main.get_command(app).commands) == set(PIPELINE_ORDER)  # type: ignore[attr-defined]
    assert PIPELINE_ORDER.index("compile") < PIPELINE_ORDER.index("stats") < PIPELINE_ORDER.index("filter") \
        < PIPELINE_ORDER.index("fit-buckets") < PIPELINE_ORDER.index("oomptimize") < PIPELINE_ORDER.index("plan-batches")


def test_help_shows_no_type_for_plain_flags() -> None:
    for path in ["", *_commands()]:
        res = runner.invoke(app, [*path.split(), "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, path


def test_one_name_and_short_option_for_one_idea() -> None:
    """``--manifest`` is ``-m`` and ``--buckets`` ``-b`` wherever they exist; the padded-seconds
    budget is ``--max-duration-budget`` in fit-buckets and padding; ``--threads`` (the tokenizer
    trainer's) is not compile's header-read threads, which are ``--probe-threads``."""
    for path, cmd in _commands().items():
        for p in cmd.params:  # type: ignore[attr-defined]
            if p.hidden:
                continue
            if "--manifest" in p.opts:
                assert "-m" in p.opts, path
            if "--buckets" in p.opts:
                assert "-b" in p.opts, path
            assert "--budget" not in p.opts, path
    cmds = _commands()
    for path in ("fit-buckets", "padding"):
        assert any("--max-duration-budget" in p.opts for p in cmds[path].params)  # type: ignore[attr-defined]
    assert [p.name for p in cmds["compile"].params if "--probe-threads" in p.opts]  # type: ignore[attr-defined]
    assert [path for path, c in cmds.items()
            if any("--threads" in p.opts and not p.hidden for p in c.params)] == ["train-tokenizer"]  # type: ignore[attr-defined]


def test_old_names_still_work(corpus: Corpus) -> None:
    new = runner.invoke(app, ["padding", str(corpus.manifest), "-b", str(corpus.buckets), "--max-duration-budget", "20"])
    old = runner.invoke(app, ["padding", str(corpus.manifest), "-b", str(corpus.buckets), "--budget", "20"])
    assert new.exit_code == old.exit_code == 0 and new.stdout == old.stdout
    assert "padding, 20 s padded audio per batch" in new.stdout


def test_every_built_in_model_is_listed_and_accepted(corpus: Corpus, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    res = runner.invoke(app, ["oomptimize", "--help"], env={"COLUMNS": "400"})
    assert "tiny-tdt" in res.output and "tiny-rnnt" in res.output
    ok = runner.invoke(app, ["oomptimize", str(corpus.buckets), "--model", "tiny-tdt", "--estimate",
                             "--gpu-memory", "1GiB", "--no-cache", "-o", str(tmp_path / "s.json")])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(app, ["oomptimize", str(corpus.buckets), "--model", "tiny-tdtt", "--estimate",
                              "--gpu-memory", "1GiB", "-o", str(tmp_path / "t.json")])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --model: 'tiny-tdtt': not a known model ("), bad.output
    assert "tiny-tdt" in bad.stderr


def test_model_names_are_the_built_in_models() -> None:
    pytest.importorskip("torch")
    from oom.models import CONFIGS
    from oom.transducer import TRANSDUCER_CONFIGS

    assert set(MODEL_NAMES) == set(CONFIGS) | set(TRANSDUCER_CONFIGS)


def test_plurals_and_no_negative_zero(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    assert (plural(1, "batch"), plural(2, "batch"), plural(1, "container"), plural(1500, "row"), plural(4, "epoch")) == \
        ("1 batch", "2 batches", "1 container", "1,500 rows", "4 epochs")
    assert (pct(-0.0001), pct(-0.00004, 2), pct(-0.02), pct(0.1234)) == ("0.0%", "0.00%", "-2.0%", "12.3%")
    res = runner.invoke(app, ["simulate", str(plan), "--world-sizes", "1,2,3,5,6,7,8,64"])
    assert res.exit_code == 0, res.output
    text = res.stdout + runner.invoke(app, ["verify", str(plan), "-m", str(corpus.manifest)]).stdout
    text += runner.invoke(app, ["pack", str(corpus.manifest), "-o", str(tmp_path / "packed"),
                                "--num-parts", "1"]).stdout
    assert not re.search(r"-0\.0+%", text), text
    assert not re.search(r"(?<![\d.,])1 (batches|containers|steps|rows|ranks|buckets|epochs|shards|groups)\b", text), text
    assert "1 container written" in text and "1 shard," in text
