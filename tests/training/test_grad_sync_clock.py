"""The step log separates a rank's own forward + backward from the gradient all-reduce's wait: in
a real 2-rank gloo DDP step where rank 1's forward is slower, rank 0's compute is short and its
sync holds the wait, rank 1's compute holds its slowness (a clock to the all-reduce's end would
give both ranks the slow one's time). A log written before ``grad_sync_s`` reads as null there."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from dataprep.training.loop import STEP_TIMES_SCHEMA, GradSyncClock, read_step_times
from tests.warm_python import COMMANDS, run_ranks

REPO = Path(__file__).resolve().parents[2]
SLOW_S = 0.25


class _Slow(torch.nn.Module):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)  # a slower rank (another GPU type, a busy host)
        return self.lin(x)


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(_Slow(SLOW_S if rank == 1 else 0.0))
        clock = GradSyncClock(ddp, torch.device("cpu"))
        got = []
        for _ in range(3):
            clock.start()
            ddp(torch.ones(2, 8)).sum().backward()
            got.append(clock.split(time.perf_counter()))
        pq.write_table(pa.table({"fb": [g[0] for g in got], "sync": [g[1] for g in got]}), f"{out}/{rank}.parquet")
    finally:
        dist.destroy_process_group()


def test_the_fast_rank_waits_in_sync_not_in_compute(tmp_path: Path) -> None:
    """Each rank a process of its own, forked from a server that imported torch once
    (:func:`tests.warm_python.run_python`), the two at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys\nfrom tests.training.test_grad_sync_clock import _rank\n_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for res in run_ranks(2, lambda r: (["-c", code, str(r), str(port), str(tmp_path)], env), cwd=REPO, timeout=300,
                         preload=COMMANDS):
        assert res.returncode == 0, res.stderr[-3000:]
    fast, slow = (pq.read_table(tmp_path / f"{r}.parquet").to_pydict() for r in (0, 1))
    for i in range(1, 3):  # the first step also waits for the other process to start
        assert fast["fb"][i] < 0.1 and fast["sync"][i] > SLOW_S * 0.7
        assert slow["fb"][i] > SLOW_S * 0.9 and slow["sync"][i] < 0.1


def test_a_log_without_grad_sync_reads_as_null(tmp_path: Path) -> None:
    old = pa.schema([f for f in STEP_TIMES_SCHEMA if f.name != "grad_sync_s"])
    path = tmp_path / "steps-rank-00000.parquet"
    pq.write_table(pa.table({"rank": [0, 0], "step": [0, 1], "data_wait_s": [0.1, 0.1], "forward_backward_s": [1.0, 1.0],
                             "optimizer_s": [0.1, 0.1]}, schema=old), path)
    assert read_step_times(path, 1) == [{"rank": 0, "step": 0, "data_wait_s": 0.1, "forward_backward_s": 1.0,
                                         "optimizer_s": 0.1, "grad_sync_s": None}]
