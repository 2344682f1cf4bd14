"""Every benchmark script still runs, at a toy size (figures are not checked: benchmarks
measure, tests do not time). The quick ones run in CI; the heavy ones are ``slow``
(``make bench-smoke`` runs them all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.warm_python import COMMANDS, run_python

REPO = Path(__file__).resolve().parents[1]

QUICK = {
    "bench_read.py": ["--rows", "5000", "--repeats", "1"],
    "bench_report.py": ["--rows", "5000", "--repeats", "1"],
    "bench_plan.py": ["--rows", "20000", "--runs", "1", "--world-size", "8", "--skip-lhotse", "--skip-simulator",
                      "--balance", "0.05", "--memory-limit", "1MiB", "--replan", "--corpora", "3"],
    "bench_hash.py": ["--rows", "20000", "--repeats", "1", "--work", "{tmp}"],
    "bench_compile.py": ["--rows", "5000", "--repeats", "1", "--probe-files", "50", "--tokenize-texts", "2000",
                         "--skip-cli"],
    "bench_containers.py": ["--utterances", "60", "--repeats", "1", "--work", "{tmp}"],
    "bench_dynres.py": ["--seeds", "1", "--targets", "1000", "--repeats", "1", "--model", "tiny", "--rows", "4000"],
    "bench_html_report.py": ["--rows", "5000", "--world-size", "4", "--repeats", "1", "--work", "{tmp}"],
    "bench_calibrate.py": ["--rows", "3000", "--world-size", "4", "--epochs", "1", "--repeats", "1"],
    "bench_object_store.py": ["--utterances", "40", "--latency-ms", "5", "--runs", "1", "--work", "{tmp}"],
    "bench_store_compile.py": ["--rows", "60", "--tars", "2", "--latency-ms", "0", "--work", "{tmp}"],
    "bench_store_clients.py": ["--ranges", "8", "--repeats", "1", "--latency-ms", "0"],
    "bench_pack.py": ["--rows", "2000", "--world-size", "4", "--repeats", "1"],
}
SLOW = {
    "bench_lookup.py": ["--rows", "20000", "--world-size", "2", "--steps", "3", "--repeats", "1", "--target", "1e6",
                        "--work", "{tmp}"],
    "bench_calibrate_ddp.py": ["--rows", "600", "--repeats", "1"],
    "bench_stream.py": ["--rows", "5000", "--repeats", "1", "--dir", "{tmp}", "--world-sizes", "2"],
    "bench_probe.py": ["--files", "50", "--repeats", "1", "--dir", "{tmp}"],
    "bench_loader.py": ["--utterances", "2000", "--world-size", "2", "--repeats", "1", "--batches", "5",
                        "--work", "{tmp}"],
    "bench_integrations.py": ["--utterances", "2000", "--world-size", "2", "--repeats", "1", "--export-rows", "2000",
                              "--work", "{tmp}"],
    "bench_fill.py": ["--worlds", "2", "--synthetic-rows", "5000", "--synthetic-worlds", "2", "--lhotse-max-world", "0",
                      "--seeds", "2"],
    "bench_strategies.py": ["--worlds", "8", "--synthetic-rows", "5000"],
    "bench_buckets.py": ["--rows", "20000", "--repeats", "1"],
    "bench_oom.py": ["--models", "tiny", "--skip-headline", "--exact-buckets", "1"],
    "bench_stream_checks.py": ["--rows", "5000", "--repeats", "1", "--work", "{tmp}"],
    "bench_stream_fit.py": ["--rows", "20000", "--runs", "1", "--dir", "{tmp}"],
    "bench_padding_baseline.py": ["--rows", "2000", "--seeds", "2", "--buffer", "500"],
}
NEEDS_SHARED_DATA = {"bench_dynres.py", "bench_fill.py", "bench_strategies.py", "bench_buckets.py",
                     "bench_padding_baseline.py", "bench_pack.py"}


def test_every_benchmark_is_listed() -> None:
    assert {p.name for p in (REPO / "benchmarks").glob("bench_*.py")} == set(QUICK) | set(SLOW)


def _run(script: str, args: list[str], tmp_path: Path) -> None:
    if script in NEEDS_SHARED_DATA:
        from tests.conftest import shared_file

        shared_file("librispeech.train-clean-100.csv")
    cmd = [str(REPO / "benchmarks" / script), *(a.format(tmp=tmp_path) for a in args)]
    res = run_python(cmd, cwd=REPO, preload=COMMANDS)  # as ``python SCRIPT ARGS``, the imports paid once
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert res.stdout.strip(), "a benchmark prints its figures"


@pytest.mark.parametrize("script", sorted(QUICK))
def test_quick_benchmark_runs(script: str, tmp_path: Path) -> None:
    _run(script, QUICK[script], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SLOW))
def test_heavy_benchmark_runs(script: str, tmp_path: Path) -> None:
    _run(script, SLOW[script], tmp_path)
