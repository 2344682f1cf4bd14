"""``dataprep report`` benchmark: a 10M-row manifest with buckets and a W=128 plan.

    python benchmarks/bench_html_report.py                       # 10M rows, W=128
    python benchmarks/bench_html_report.py --rows 1000000 --repeats 1
    python benchmarks/bench_html_report.py --manifest-only --code ../previous-checkout  # a baseline
    python benchmarks/bench_html_report.py --code ../previous-checkout --code .  # both, same inputs

Inputs: :func:`bench_plan.synthetic` with TPS, two languages and two corpora added, buckets by
:func:`bench_plan.buckets_for` (30 x 2, 600 s padded budget), ``plan-batches``' default plan.
Prints the report's wall time and peak RSS (VmHWM), run as a user runs it in a fresh subprocess
on 2 cores, the page's size, and its "interactive" time in headless chromium (navigation start
until every chart is drawn and the tables sort, ``window.__report.ms``), median of --repeats.
Targets: <= 60 s, <= 2 GiB, <= 5 MB, <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from bench_plan import buckets_for, synthetic  # noqa: E402

from dataprep.planning import build_plan  # noqa: E402
from dataprep.planning import PlanOptions  # noqa: E402
from manifests.manifest_write import write_manifest  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from dataprep.report.aggregates import collect_report
from dataprep.report.page import vega_bundle, write_page
t1 = time.perf_counter()
data = collect_report(sys.argv[1], buckets=sys.argv[2] or None, plan=sys.argv[3] or None)
t2 = time.perf_counter()
vega_bundle()
t3 = time.perf_counter()
size = write_page(data, sys.argv[4])
t4 = time.perf_counter()
try:  # this process's own peak: ru_maxrss keeps the parent's size from before the exec
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"wall": t4 - t0, "import": t1 - t0, "aggregates": t2 - t1, "bundle": t3 - t2, "page": t4 - t3,
                  "rss_gib": hwm, "bytes": size}))
"""


def make_inputs(tmp: Path, rows: int, world: int) -> tuple[Path, Path, Path]:
    """Manifest, buckets.json and a plan of ``rows`` utterances at ``world`` ranks."""
    t0 = time.perf_counter()
    df = synthetic(rows)
    rng = np.random.default_rng(1)
    corpus = rng.random(rows) < 0.3
    df = df.with_columns(
        (pl.col("num_tokens") / pl.col("duration")).alias("tps"),
        pl.Series("lang", np.where(corpus, "id", "en")),
        pl.format("{}:{}", pl.Series("src", np.where(corpus, "cv/train.jsonl", "ls/train.jsonl")),
                  pl.int_range(1, rows + 1)).alias("origin"),
    )
    manifest, buckets = tmp / "kept.parquet", tmp / "buckets.json"
    write_manifest(df, manifest)
    buckets_for(df, buckets, 600.0)
    del df
    t1 = time.perf_counter()
    build_plan(manifest, buckets, tmp / "plan", PlanOptions(world_size=world))
    print(f"inputs: {rows:,} rows, buckets and a W={world} plan in {t1 - t0:.1f} + {time.perf_counter() - t1:.1f} s",
          flush=True)
    return manifest, buckets, tmp / "plan"


def run_report(manifest: Path, buckets: Path | None, plan: Path | None, out: Path, code: Path = REPO) -> dict:
    """One report in a fresh process running ``code``'s dataprep (None: no such input)."""
    env = dict(os.environ, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="2", PYTHONPATH=str(code))
    cmd = [sys.executable, "-c", CHILD, str(manifest), str(buckets or ""), str(plan or ""), str(out)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0,1", *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=code)  # cwd: `python -c` imports from it
    if res.returncode:
        sys.exit(f"report failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def time_to_interactive(page_path: Path, repeats: int) -> list[float] | None:
    """Milliseconds from navigation start until every chart is drawn, per opening."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path(CHROMIUM).exists():
        return None
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"]
    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=args)
        for _ in range(repeats):
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.route("**/*", lambda r: r.continue_() if r.request.url == page_path.as_uri() else r.abort())
            page.goto(page_path.as_uri())
            page.wait_for_function("window.__report && window.__report.ready", timeout=120_000)
            state = page.evaluate("window.__report")
            if state["errors"]:
                sys.exit(f"the page reported errors: {state['errors']}")
            out.append(float(state["ms"]))
            page.close()
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--world-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="report runs and page openings (medians)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the inputs (default: a temporary one)")
    ap.add_argument("--manifest-only", action="store_true", help="report the manifest alone (no buckets, no plan)")
    ap.add_argument("--code", type=Path, action="append", default=None,
                    help="checkout whose dataprep makes the report (a baseline); repeat it to compare checkouts on "
                         "the same inputs, runs alternating (default: this one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as td:
        tmp = Path(td)
        manifest, buckets, plan = make_inputs(tmp, args.rows, args.world_size)
        if args.manifest_only:
            buckets = plan = None
        codes = args.code or [REPO]
        runs: dict[Path, list[dict]] = {c: [] for c in codes}
        for _ in range(args.repeats):
            for c in codes:
                runs[c].append(run_report(manifest, buckets, plan, tmp / "report.html", c))
        what = "manifest only" if args.manifest_only else f"W={args.world_size}"
        for c in codes:
            med = {k: statistics.median(r[k] for r in runs[c]) for k in runs[c][0]}
            print(f"dataprep report ({c}), {args.rows:,} rows, {what}, 2 cores, median of {args.repeats}: "
                  f"wall {med['wall']:.1f} s (import {med['import']:.1f}, aggregates {med['aggregates']:.1f}, "
                  f"Vega bundle {med['bundle']:.1f}, page {med['page']:.1f}), peak RSS {med['rss_gib']:.2f} GiB, "
                  f"file {med['bytes'] / 1e6:.2f} MB")
        tti = time_to_interactive(tmp / "report.html", args.repeats)
        if tti is None:
            print("interactive: skipped (playwright or Debian's chromium is not installed)")
        else:
            print(f"interactive in headless chromium (navigation start -> every chart drawn): median "
                  f"{statistics.median(tti):.0f} ms (runs: {', '.join(f'{t:.0f}' for t in tti)})")


if __name__ == "__main__":
    main()
