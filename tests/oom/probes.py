"""Probe targets run by tests in a subprocess (``oom.isolate``): real child processes that
crash, die or raise the real ``torch.cuda.OutOfMemoryError``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def crash_first(counter: str, batch_size: int) -> dict[str, Any]:
    """Dies without a record (hard exit, as a lost CUDA context does) on the first call."""
    path = Path(counter)
    n = int(path.read_text()) if path.exists() else 0
    path.write_text(str(n + 1))
    if n == 0:
        os._exit(139)
    return {"peak_bytes": 1000 * batch_size, "step_seconds": 0.01}


def always_crash(counter: str) -> dict[str, Any]:
    path = Path(counter)
    n = int(path.read_text()) if path.exists() else 0
    path.write_text(str(n + 1))
    os._exit(1)


def oom_above(limit: int, batch_size: int) -> dict[str, Any]:
    """Raises the real CUDA OOM exception above ``limit`` (what a GPU step raises)."""
    import torch

    if batch_size > limit:
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch_size} MiB")
    return {"peak_bytes": 1 << 20, "step_seconds": 0.02}
