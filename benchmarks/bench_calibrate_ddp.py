"""A real CPU DDP run (gloo, 2 ranks) whose ranks differ in speed, re-planned mid-run from its own
step log: straggling before and after ``calibrate`` + ``replan --cost-model --rank-speed``.

    python benchmarks/bench_calibrate_ddp.py [--rows 3000] [--slow 2.0] [--repeats 1] [--model calibrated]

A plan of ``--rows`` synthetic utterances (8x2 buckets, 2 ranks, 2 epochs, the built-in cost model);
each rank trains a tiny model (linear layers and one attention score matrix over the padded frames
at 40 ms, an embedding of the padded tokens) on random features of its batches' shapes; rank 1
runs ``--slow`` forward + backward passes a batch (the extra ones without DDP's sync). The thin
loop's logger (``GradSyncClock``, ``write_step_times``) logs each rank's own compute apart from
the all-reduce's wait, in CPU seconds of the rank's one thread (``--wall``: wall seconds, blurred
by a shared host). At ``--at-step`` (mid-epoch 0), rank 0 runs ``dataprep calibrate`` and ``dataprep replan --at-step K
--cost-model --rank-speed`` (``--model builtin``: speeds only) and both ranks continue on the
re-plan. Straggling per step: the slowest rank's compute over the ranks' mean, before and after K.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dataprep.testing import write_plan_inputs  # noqa: E402
from dataprep.training.loop import GradSyncClock, write_step_times  # noqa: E402
from manifests.plan_files import PlanShard  # noqa: E402
from manifests.plan_meta import read_plan_meta  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FRAMES_PER_S = 25  # 40 ms frames: a subsampled encoder's rate
DIM, HIDDEN = 64, 512


class Tiny(torch.nn.Module):
    """Cost ~ size x padded frames (two linear layers), size x padded frames^2 (one self-attention
    score matrix, as an encoder's) and size x padded tokens (an embedding and a linear layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, DIM))
        self.emb = torch.nn.Embedding(64, DIM)
        self.dec = torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        att = torch.softmax(h @ h.transpose(1, 2) / DIM**0.5, dim=-1) @ h
        return att.mean() + self.dec(self.emb(tok)).mean()


def _run_steps(ddp: torch.nn.Module, opt: torch.optim.Optimizer, clock: GradSyncClock, plan: Path, rank: int,
               start: int, stop: int, rows: list[dict[str, float]], slow: float) -> None:
    """Train ``start`` .. ``stop`` of ``plan``; ``slow`` > 1: that many forward + backward passes
    of each batch (the extra ones without DDP's sync; a fraction: that share of the batch once
    more), as a slower GPU computes the same batch."""
    gen = torch.Generator().manual_seed(rank)
    for b in PlanShard(plan, rank).iter_batches(start):
        if b.step >= stop:
            break
        size = len(b.ids)
        frames = max(1, round(_shape[rank][b.step][0] * FRAMES_PER_S))
        tokens = int(_shape[rank][b.step][1])
        x = torch.randn(size, frames, DIM, generator=gen)
        tok = torch.randint(0, 64, (size, tokens), generator=gen)
        clock.start()
        opt.zero_grad(set_to_none=True)
        extra, part = int(slow) - 1, slow - int(slow)
        with ddp.no_sync():  # type: ignore[operator]
            for _ in range(extra):
                ddp(x, tok).backward()
            if part:
                n = max(1, round(size * part))
                ddp(x[:n], tok[:n]).backward()
        loss = ddp(x, tok)
        loss.backward()
        t1 = clock.timer()
        fb, sync = clock.split(t1)
        opt.step()
        t2 = clock.timer()
        rows.append({"rank": rank, "step": b.step, "data_wait_s": 0.0, "forward_backward_s": fb,
                     "optimizer_s": t2 - t1, "grad_sync_s": sync})


_shape: dict[int, dict[int, tuple[float, int]]] = {}


def _shapes(plan: Path, rank: int) -> dict[int, tuple[float, int]]:
    t = PlanShard(plan, rank).read(columns=["step", "max_duration", "max_tokens"])
    return dict(zip(t["step"].to_pylist(), zip(t["max_duration"].to_pylist(), t["max_tokens"].to_pylist())))


def _rank(rank: int, port: int, work: str, slow: float, at: int, cpu_time: bool, calibrated_model: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        root = Path(work)
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(Tiny())
        slow = slow if rank == 1 else 1.0
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        clock = GradSyncClock(ddp, torch.device("cpu"), timer=time.thread_time if cpu_time else time.perf_counter)
        rows: list[dict[str, float]] = []
        plan = root / "plan"
        _shape[rank] = _shapes(plan, rank)
        _run_steps(ddp, opt, clock, plan, rank, 0, at, rows, slow)
        write_step_times(root / "log" / f"steps-rank-{rank:05d}.parquet", rows)
        dist.barrier()
        if rank == 0:  # what a user runs between the two parts of the job
            model = ["--cost-model", str(root / "costmodel.json")] if calibrated_model else []
            for args in (["calibrate", str(plan), str(root / "log"), "-o", str(root / "costmodel.json")],
                         ["replan", str(plan), "--at-step", str(at), *model,
                          "--rank-speed", str(root / "costmodel.json"), "-o", str(root / "plan2")]):
                res = subprocess.run([sys.executable, "-m", "dataprep.cli", *args], capture_output=True, text=True,
                                     check=False, cwd=root, env={**os.environ, "PYTHONPATH": str(REPO)})
                if res.returncode:
                    raise RuntimeError(f"dataprep {args[0]}: {res.stderr.strip()}")
                print(f"$ dataprep {' '.join(args)}\n{res.stdout.strip()}", flush=True)
        dist.barrier()
        plan2 = root / "plan2"
        _shape[rank] = _shapes(plan2, rank)
        _run_steps(ddp, opt, clock, plan2, rank, at, read_plan_meta(plan2).num_steps, rows, slow)
        write_step_times(root / "log" / f"steps-rank-{rank:05d}.parquet", rows)
    finally:
        dist.destroy_process_group()


def straggling(log: Path, at: int) -> dict[str, tuple[float, float]]:
    """Before and after ``at``: the mean over steps of (slowest rank's compute / the ranks' mean),
    and the same weighted by time (sum of the slowest over sum of the means); compute is forward
    + backward + optimizer, the all-reduce's wait excluded; the first 3 steps (warm-up) left out."""
    df = pl.read_parquet(log / "steps-rank-*.parquet").with_columns(
        (pl.col("forward_backward_s") + pl.col("optimizer_s")).alias("c"))
    per = df.group_by("step").agg(pl.col("c").max().alias("hi"), pl.col("c").mean().alias("mean")).sort("step")
    per = per.filter(pl.col("step") >= 3).with_columns((pl.col("hi") / pl.col("mean")).alias("r"))
    parts = [per.filter(pl.col("step") < at), per.filter(pl.col("step") >= at)]
    return {"per step": (float(parts[0]["r"].mean()), float(parts[1]["r"].mean())),  # type: ignore[arg-type]
            "time-weighted": (float(parts[0]["hi"].sum() / parts[0]["mean"].sum()),
                              float(parts[1]["hi"].sum() / parts[1]["mean"].sum()))}


def once(work: Path, rows: int, slow: float, cpu_time: bool, calibrated_model: bool,
         at_step: int | None, cost_equal: bool) -> dict[str, tuple[float, float]]:
    work.mkdir(parents=True, exist_ok=True)
    manifest, buckets = write_plan_inputs(work, rows, seed=0, num_buckets=8)
    subprocess.run([sys.executable, "-m", "dataprep.cli", "plan-batches", str(manifest), "--buckets", str(buckets),
                    "--world-size", "2", "--epochs", "2", "--seed", "0", "-o", str(work / "plan"),
                    *(["--cost-equal"] if cost_equal else [])],
                   check=True, capture_output=True, cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)})
    meta = read_plan_meta(work / "plan")
    at = meta.steps_per_epoch[0] // 2 if at_step is None else at_step
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    mp.spawn(_rank, args=(port, str(work), slow, at, cpu_time, calibrated_model), nprocs=2, join=True)
    wall = time.perf_counter() - t
    got = straggling(work / "log", at)
    print(f"{meta.num_steps} steps (re-planned at {at}), {wall:.1f} s: slowest rank / mean, per step "
          f"{got['per step'][0]:.3f} before, {got['per step'][1]:.3f} after; time-weighted "
          f"{got['time-weighted'][0]:.3f} before, {got['time-weighted'][1]:.3f} after", flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--slow", type=float, default=2.0, help="work per sample of rank 1 (rank 0: 1)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--at-step", type=int, default=None,
                    help="the step the run is calibrated and re-planned at (default: the middle of epoch 0)")
    ap.add_argument("--cost-equal", action="store_true",
                    help="the uncalibrated plan with --cost-equal (the built-in model's equal-time batch sizes: "
                    "batches of different padded seconds, which the fit needs to tell overhead from per-frame cost)")
    ap.add_argument("--model", choices=["calibrated", "builtin"], default="calibrated",
                    help="replan with the calibrated cost model and rank speeds, or the rank speeds only")
    ap.add_argument("--wall", action="store_true", help="log wall seconds (default: each rank's CPU seconds, "
                    "time.thread_time: what a quiet host gives when the host is shared)")
    args = ap.parse_args()
    results = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(once((args.work or Path(tmp)) / f"run{i}", args.rows, args.slow, not args.wall,
                                args.model == "calibrated", args.at_step, args.cost_equal))
    print(f"\nmedian of {len(results)} run(s), rank 1 doing {args.slow}x the work; slowest rank's compute / the "
          "ranks' mean, with the uncalibrated plan -> after calibrate + replan --cost-model --rank-speed; the "
          "straggler time (the excess over 1) cut by (goal >= 30%):")
    for k in ("per step", "time-weighted"):
        cuts = [1 - (r[k][1] - 1) / (r[k][0] - 1) for r in results]
        print(f"  {k:<14} {statistics.median(r[k][0] for r in results):.3f} -> "
              f"{statistics.median(r[k][1] for r in results):.3f}: cut {statistics.median(cuts):.0%} (runs: "
              f"{', '.join(f'{c:.0%}' for c in cuts)})")


if __name__ == "__main__":
    main()
