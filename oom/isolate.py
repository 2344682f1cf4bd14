"""Each probe in its own subprocess: an OOM or a crashed CUDA context cannot poison the next.

The child (``python -m oom.isolate``) imports ``target`` (``"package.module:function"``),
calls it with JSON keyword arguments and writes one JSON record: ``{"status": "ok",
"peak_bytes", "step_seconds"}``, ``{"status": "oom", "message"}`` when the call raised
``torch.cuda.OutOfMemoryError`` (or a "CUDA out of memory" error), or ``{"status":
"error", "message"}``. A child that dies without a record (segfault, killed, CUDA context
lost) or with an error is retried; after ``retries`` more attempts it raises
:class:`ProbeCrashed`. Only an OOM record counts as "does not fit".
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from manifests.errors import DataprepError, OptionError
from oom.search import ProbeResult


class ProbeCrashed(DataprepError, RuntimeError):
    """A probe that failed without an OOM record on every attempt (one line: the last error)."""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_isolated(
    target: str,
    kwargs: dict[str, Any],
    retries: int = 2,
    timeout_s: float = 900.0,
) -> tuple[ProbeResult, int]:
    """Run ``target(**kwargs)`` in a fresh Python process; return (result, attempts).

    ``target`` returns a dict with ``peak_bytes`` and ``step_seconds``.
    """
    last = "no attempt"
    for attempt in range(1, retries + 2):
        with tempfile.TemporaryDirectory(prefix="oom-probe-") as tmp:
            out = Path(tmp) / "result.json"
            cmd = [sys.executable, "-m", "oom.isolate", "--target", target,
                   "--kwargs", json.dumps(kwargs), "--out", str(out)]
            try:
                proc = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=timeout_s, check=False)
                tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
                last = f"exit status {proc.returncode}: {tail[0]}"
            except subprocess.TimeoutExpired:
                last = f"timed out after {timeout_s:.0f} s"
            record = None
            if out.exists():
                try:
                    record = json.loads(out.read_text(encoding="utf-8"))
                except ValueError:
                    record = None
        if record is None:
            continue  # crashed without a record: retry, never count as OOM
        if record["status"] == "oom":
            return ProbeResult(fits=False, oom=True), attempt
        if record["status"] == "ok":
            return ProbeResult(
                fits=True, peak_bytes=record.get("peak_bytes"), step_seconds=record.get("step_seconds")
            ), attempt
        last = record.get("message", "error")
    raise ProbeCrashed(f"probe {target} {kwargs} failed {retries + 1} times without an OOM record: {last}")


def is_oom(exc: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError`` and CUDA "out of memory" runtime errors."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _load(target: str) -> Any:
    mod, _, fn = target.partition(":")
    return getattr(importlib.import_module(mod), fn)


def _write(path: str, record: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="run one OOM probe (internal)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--kwargs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        res = _load(a.target)(**json.loads(a.kwargs))
    except BaseException as exc:  # noqa: BLE001 - the record says what happened
        if is_oom(exc):
            _write(a.out, {"status": "oom", "message": str(exc).splitlines()[0] if str(exc) else "OOM"})
            return 0
        _write(a.out, {"status": "error", "message": "".join(traceback.format_exception_only(exc)).strip()})
        return 1
    _write(a.out, {"status": "ok", "peak_bytes": res.get("peak_bytes"), "step_seconds": res.get("step_seconds")})
    return 0


# --- the probe targets -----------------------------------------------------------------


def step_probe(
    model: str,
    frames: int,
    tokens: int,
    batch_size: int,
    device: str = "cuda",
    memory_fraction: float = 0.9,
    steps: int = 3,
    loss_mode: str = "batched",
) -> dict[str, Any]:
    """One probe: ``steps`` full training steps (bf16 autocast, AdamW) of ``model`` on a
    synthetic batch of ``batch_size`` x (``frames`` frames, ``tokens`` tokens), the
    transducer loss in ``loss_mode``.

    On CUDA the process may use ``memory_fraction`` of the GPU; the peak is
    ``torch.cuda.max_memory_allocated`` over all steps (the second step is the first with
    optimizer state), the time the median of the steps after the first. On CPU (dry runs)
    the peak is the live-storage peak of real tensors (:class:`oom.estimate.MemoryTracker`).
    """
    import torch

    from oom.estimate import MemoryTracker
    from oom.models import build_model, model_input_spec
    from oom.step import Shape, make_optimizer, synthetic_batch, training_step

    dev = torch.device(device)
    shape = Shape(frames=frames, tokens=tokens)
    times: list[float] = []
    if dev.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(memory_fraction, dev)
        with dev:
            net = build_model(model)
        net = net.to(dev).train()
        n_mels, vocab = model_input_spec(net)
        opt = make_optimizer(net)
        batch = synthetic_batch(batch_size, shape, n_mels, vocab, device=dev)
        torch.cuda.reset_peak_memory_stats(dev)
        for _ in range(steps):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            training_step(net, opt, batch, "cuda", loss_mode=loss_mode)
            torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        peak = int(torch.cuda.max_memory_allocated(dev))
    else:
        tracker = MemoryTracker()
        with tracker:
            net = build_model(model).train()
            n_mels, vocab = model_input_spec(net)
            opt = make_optimizer(net)
            batch = synthetic_batch(batch_size, shape, n_mels, vocab)
            for _ in range(steps):
                t0 = time.perf_counter()
                training_step(net, opt, batch, "cpu", loss_mode=loss_mode)
                times.append(time.perf_counter() - t0)
        peak = tracker.ledger.peak
    later = sorted(times[1:] or times)
    return {"peak_bytes": peak, "step_seconds": later[len(later) // 2]}


#: where a CUDA device is absent: what to do instead
NO_GPU_HINT = ("run on a machine with a GPU, or size without one: --estimate --gpu-memory 80GiB "
               "(your GPU's memory)")


def device_info(device: str) -> dict[str, Any]:
    """Name and total memory (bytes) of a CUDA device, queried in a subprocess so that this
    process never holds a CUDA context (it would take memory from the probes). No such device
    (a CPU build of torch, no GPU visible, an index past the last): :class:`OptionError` on
    ``device``, one line saying why and what to do instead."""
    code = (
        "import json, sys, torch\n"
        "d = torch.device(sys.argv[1])\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "if n == 0 or (d.index or 0) >= n:\n"
        "    why = (f'this torch ({torch.__version__}) is built without CUDA' if torch.version.cuda is None\n"
        "           else f'only {n} CUDA device(s) visible' if n else 'no CUDA device is visible')\n"
        "    print(json.dumps({'absent': why}))\n"
        "    sys.exit(0)\n"
        "p = torch.cuda.get_device_properties(d)\n"
        "print(json.dumps({'name': p.name, 'total_memory': int(p.total_memory)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, device], env=_child_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["unknown error"]
        raise ProbeCrashed(f"cannot query {device}: {tail[0]}")
    info = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    if "absent" in info:
        raise OptionError("device", f"{device}: {info['absent']}; {NO_GPU_HINT}")
    return info


if __name__ == "__main__":
    sys.exit(main())
