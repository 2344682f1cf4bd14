"""Non-finite and random numbers in every float option of every command (issue 24, class 4):
the flags are found from the commands' signatures, so a new float option is covered the day it
is added. Each run is a one-line error naming the flag (exit 2) or a success; a NaN or an
infinity is always refused."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dataprep.cli import app
from tests.conftest import SLOW_EXAMPLES
from tests.training._consumer import Corpus

runner = CliRunner()
#: flags holding a float inside a string: flag -> how the value is written
WRAPPED = {("plan-batches", "--coef"): "overhead={}", ("simulate", "--coef"): "per_frame={}",
           ("simulate", "--slow-rank"): "0={}"}


def _commands(typer_app=app, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Callable]]:
    for c in typer_app.registered_commands:
        yield (*prefix, c.name), c.callback
    for g in typer_app.registered_groups:
        yield from _commands(g.typer_instance, (*prefix, g.name or g.typer_instance.info.name))


def float_flags() -> list[tuple[str, str]]:
    """(command, flag) for every option annotated ``float`` (or ``Optional[float]``), plus :data:`WRAPPED`."""
    out = []
    for name, cb in _commands():
        for pname, hint in typing.get_type_hints(cb, include_extras=True).items():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            base, meta, *_ = typing.get_args(hint)
            if getattr(meta, "hidden", False):  # an old name kept as a hidden alias: errors name the new one
                continue
            if base is float or base == typing.Optional[float]:
                flag = next((d for d in getattr(meta, "param_decls", ()) or () if d.startswith("--")),
                            "--" + pname.replace("_", "-"))
                out.append((" ".join(name), flag))
    return sorted(out) + sorted(WRAPPED)


FLAGS = float_flags()


def test_the_float_options_are_found() -> None:
    cmds = {c for c, _ in FLAGS}
    assert {"plan-batches", "padding", "fit-buckets", "filter", "compile", "simulate", "train", "oomptimize"} <= cmds
    assert ("plan-batches", "--max-rate") in FLAGS and ("padding", "--balance") in FLAGS


def _base(cmd: str, flag: str, c: Corpus, plan: Path, tmp: Path) -> list[str]:
    """Arguments that make ``cmd`` run for real and fast (or, for the slow ones, reach a one-line
    error on a missing input once the options are checked)."""
    dynres = ["--dynamic-resolution"] if flag in ("--frames-per-second", "--min-rate", "--max-rate", "--floor-rate") else []
    missing = str(tmp / "missing")
    return {
        "fit-buckets": [str(c.manifest), "-o", str(tmp / "b.json")],
        "padding": [str(c.manifest), "--buckets", str(c.buckets)],
        "compile": [missing + ".jsonl", "--tokenizer", str(c.spm), "-o", str(tmp / "m.parquet")],
        "oomptimize": [missing + ".json", "--model", "tiny", "-o", str(tmp / "o.json")],
        "plan-batches": [str(c.manifest), "-b", str(c.buckets), "-w", "1", "-o", str(tmp / "p"), *dynres],
        "simulate": [str(plan), "--world-sizes", "2", *(["--strategy", "sync"] if flag == "--slow-rank" else [])],
        "filter": [str(c.manifest), "-o", str(tmp / "f.parquet")],
        "stats": [str(c.manifest)],
        "calibrate": [str(plan), missing + ".parquet", "-o", str(tmp / "costmodel.json")],
        "train": [missing, "--manifest", str(c.manifest), "--tokenizer", str(c.spm), "--checkpoint-dir",
                  str(tmp / "ck"), "--device", "cpu", "--quiet"],
    }[cmd]


def _run(cmd: str, flag: str, value: float, c: Corpus, plan: Path, tmp: Path) -> tuple[int, str]:
    text = WRAPPED.get((cmd, flag), "{}").format(repr(value) if math.isfinite(value) else str(value))
    res = runner.invoke(app, [*cmd.split(), *_base(cmd, flag, c, plan, tmp), flag, text])
    detail = f"{cmd} {flag} {text} -> {res.exit_code}\n{res.output}\n{res.exception!r}"
    assert res.exit_code in (0, 2), detail
    assert res.exception is None or isinstance(res.exception, SystemExit), detail
    lines = res.stderr.strip().splitlines()
    if res.exit_code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), detail
    return res.exit_code, res.stderr


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("cmd,flag", FLAGS)
def test_non_finite_is_refused_naming_the_flag(corpus: Corpus, plan: Path, tmp_path: Path, cmd: str, flag: str,
                                               value: float) -> None:
    code, err = _run(cmd, flag, value, corpus, plan, tmp_path)
    assert code == 2 and (flag in err or "cost coefficient" in err), (cmd, flag, value, err)


@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_any_float_in_any_float_option(corpus: Corpus, plan: Path, tmp_path_factory: pytest.TempPathFactory,
                                       data: st.DataObject) -> None:
    cmd, flag = data.draw(st.sampled_from([f for f in FLAGS if f[0] != "train"]))  # train: covered above
    value = data.draw(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-300, 1e300]))
    code, err = _run(cmd, flag, value, corpus, plan, tmp_path_factory.mktemp("f"))
    if not math.isfinite(value):
        assert code == 2
