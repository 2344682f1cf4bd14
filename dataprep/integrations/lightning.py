"""A Lightning callback writing the step log ``dataprep calibrate`` reads, for any LightningModule
(NeMo's models included): :class:`StepTimeLog`.

Per rank and step, the seconds of data wait (the previous step's end to this batch's start),
forward + backward (this batch's start to the rank's last gradient ready), gradient sync (to the
optimizer step: DDP's all-reduce, the wait for the slowest rank; null where the model is not
wrapped in DDP or another hook holds DDP's one communication hook) and optimizer step (to the
batch's end), as ``dataprep train`` writes them: ``<folder>/steps-rank-0000r.parquet`` (:data:`dataprep.training.loop.STEP_TIMES_SCHEMA`),
rewritten atomically every ``flush_every`` steps and at the end; a resumed run keeps the rows
before its first step. ``step`` is the plan's global step: ``trainer.global_step`` plus
``first_step`` (one optimizer step per plan step, no gradient accumulation). On a GPU the device
is synchronized at each mark, so the seconds are the kernels', not their launch's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from dataprep.training.loop import GradSyncClock, read_step_times, write_step_times
from manifests.errors import DataprepError
from manifests.options import check_int


class StepTimeLog(Callback):
    """Write each rank's step times to ``folder`` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str], *, first_step: int = 0, flush_every: int = 100) -> None:
        check_int("first_step", first_step, ge=0)
        check_int("flush_every", flush_every, ge=1)
        self.folder = Path(folder)
        self.first_step = first_step
        self.flush_every = flush_every
        self.rows: list[dict[str, Any]] = []
        self._path: Path | None = None
        self._rank = 0
        self._t_end = self._t_ready = self._t_fb = 0.0
        self._since_flush = 0
        self._clock: GradSyncClock | None = None

    def _now(self, module: Any) -> float:
        device = getattr(module, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataprepError(f"{self.folder}: cannot hold the step log ({exc.strerror})") from None
        self._rank = int(trainer.global_rank)
        self._path = self.folder / f"steps-rank-{self._rank:05d}.parquet"
        self.rows = read_step_times(self._path, self.first_step + int(trainer.global_step))
        self._clock = _attach_clock(trainer, pl_module)
        self._t_end = self._now(pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._t_ready = self._now(pl_module)
        if self._clock is not None:
            self._t_ready = self._clock.start()
        self._t_fb = 0.0

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._t_fb = self._now(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = self._now(pl_module)
        fb = self._t_fb or now  # no optimizer step (skipped): all of it forward + backward
        compute, sync = (fb - self._t_ready, None) if self._clock is None else self._clock.split(fb)
        # global_step has counted this step's optimizer step already
        self.rows.append({"rank": self._rank, "step": self.first_step + int(trainer.global_step) - 1,
                          "data_wait_s": self._t_ready - self._t_end, "forward_backward_s": compute,
                          "optimizer_s": now - fb, "grad_sync_s": sync})
        self._t_end = now
        self._since_flush += 1
        if self._since_flush >= self.flush_every:
            self.flush()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.flush()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.flush()  # the steps measured before a run stopped are kept

    def flush(self) -> None:
        """Write the log now (atomically)."""
        if self._path is not None:
            write_step_times(self._path, self.rows)
        self._since_flush = 0


def _attach_clock(trainer: Any, pl_module: Any) -> GradSyncClock | None:
    """A :class:`GradSyncClock` on the strategy's DDP wrapper, or None (no DDP, or its one
    communication hook is taken: the sync then stays inside forward + backward)."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = getattr(trainer.strategy, "model", None)
    if not isinstance(ddp, DistributedDataParallel):
        return None
    try:
        return GradSyncClock(ddp, pl_module.device)
    except RuntimeError:  # a hook registered already (the strategy's ddp_comm_hook)
        return None
