"""Device-free peak-memory estimate of one training step (bytes).

The step of :mod:`oom.step` runs on fake tensors (``FakeTensorMode``: no data allocated)
under :class:`MemoryTracker`, a ``TorchDispatchMode`` that counts the bytes of every new
storage until Python frees it: parameters, gradients, AdamW state and its update's
temporaries, autocast copies, saved activations and temporaries. The peak is the maximum over
two steps (the second with the optimizer state allocated); sizes are rounded up to 512 bytes,
as the CUDA caching allocator does.

Not seen, hence the budget's headroom (``memory_fraction``, ``margin``): the CUDA context,
library workspaces, kernel scratch, allocator fragmentation, and kernel choices that differ
between CPU and CUDA. Goal: within 15 % of ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from oom.models import build_model, loss, model_input_spec
from oom.step import Shape, make_optimizer, synthetic_batch, training_step

#: Block size of the CUDA caching allocator: every allocation is a multiple of it.
CUDA_ROUNDING = 512


class Ledger:
    """Live tensor-storage bytes: each storage counted once (views and in-place results
    share it) from the operator that returned it until its last reference dies. Storages
    that existed before are not counted. Keeps the peak and an event log."""

    def __init__(self, round_to: int = CUDA_ROUNDING) -> None:
        self.round_to = max(1, round_to)
        self.live: dict[int, tuple[Any, int, int]] = {}  # storage key -> (weakref, bytes, alloc id)
        self.current = 0
        self.peak = 0
        #: Raw (unrounded) size of each storage in creation order, and the event log:
        #: ``i`` = storage ``i`` created, ``~i`` = storage ``i`` freed.
        self.sizes: list[int] = []
        self.events: list[int] = []

    def track_outputs(self, out: Any) -> None:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        raw = st.nbytes()
        n = -(-raw // self.round_to) * self.round_to
        alloc_id = len(self.sizes)
        self.sizes.append(raw)
        self.events.append(alloc_id)
        self.current += n
        self.peak = max(self.peak, self.current)

        def release(_: Any, key: int = key, n: int = n, alloc_id: int = alloc_id) -> None:
            if self.live.pop(key, None) is not None:
                self.current -= n
                self.events.append(~alloc_id)

        self.live[key] = (weakref.ref(st, release), n, alloc_id)

    def alloc_id(self, t: torch.Tensor) -> int | None:
        """The allocation id of ``t``'s storage while it is live (None if not counted)."""
        entry = self.live.get(t.untyped_storage()._cdata)
        return None if entry is None else entry[2]

    def reset_peak(self) -> None:
        self.peak = self.current


class MemoryTracker(TorchDispatchMode):
    """A dispatch mode that feeds every operator's outputs to a :class:`Ledger` (real tensors)."""

    def __init__(self, round_to: int = CUDA_ROUNDING) -> None:
        super().__init__()
        self.ledger = Ledger(round_to)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ledger.track_outputs(out)
        return out


def _tracking_fake_mode(ledger: Ledger) -> Any:
    """A ``FakeTensorMode`` that feeds the outputs of top-level operators to ``ledger``.

    Ops on fake tensors reach it even when it is not the active mode (the tensor subclass
    re-enters it), which is how the training step runs: with the mode inactive, AdamW's
    step counters are real CPU scalars whose value it can read, and dispatch is faster.
    Factory calls made outside the mode (small masks, positions) are real and not counted.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    class _Mode(FakeTensorMode):
        depth = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.depth += 1
            try:
                out = super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self.depth -= 1
            if self.depth == 0:  # decompositions re-enter: count only what the op returns
                ledger.track_outputs(out)
            return out

    mode = _Mode(allow_non_fake_inputs=True)
    # The op cache costs more in hashing than it saves on one pass through a model.
    mode.cache_enabled = False
    return mode


@dataclass(frozen=True)
class Estimate:
    """Estimated memory of one training step, in bytes."""

    peak_bytes: int  # max live bytes across the steps (the figure to compare with CUDA's peak)
    resident_bytes: int  # live after the last step: parameters + gradients + optimizer state
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    seconds: float  # wall time of the estimate itself


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def run_step_tracked(
    model_name: str,
    shape: Shape,
    batch_size: int,
    *,
    fake: bool = True,
    steps: int = 2,
    autocast_dtype: torch.dtype | None = torch.bfloat16,
    round_to: int = CUDA_ROUNDING,
    seed: int = 0,
    loss_mode: str = "batched",
) -> Estimate:
    """Build ``model_name`` and run ``steps`` full training steps on ``batch_size`` copies of
    ``shape`` on CPU, tracking live storage bytes. ``fake=True`` allocates nothing (the
    direct estimate); ``fake=False`` runs on real CPU tensors (a check of the fake run)."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    if fake:
        ledger = Ledger(round_to)
        ctx: Any = contextlib.nullcontext()
        with _tracking_fake_mode(ledger):
            model = build_model(model_name)
            n_mels, vocab = model_input_spec(model)
            batch = synthetic_batch(batch_size, shape, n_mels, vocab, seed=seed)
    else:
        ctx = MemoryTracker(round_to)
        ledger = ctx.ledger
        with ctx:
            model = build_model(model_name)
            n_mels, vocab = model_input_spec(model)
            batch = synthetic_batch(batch_size, shape, n_mels, vocab, seed=seed)
    with ctx:
        model.train()
        optimizer = make_optimizer(model)
        for _ in range(steps):
            training_step(model, optimizer, batch, "cpu", autocast_dtype, loss_mode)
        params = list(model.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        state = [v for s in optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor) and v.dim() > 0]
        return Estimate(
            peak_bytes=ledger.peak,
            resident_bytes=ledger.current,
            param_bytes=_storage_bytes(params),
            grad_bytes=_storage_bytes(grads),
            optimizer_bytes=_storage_bytes(state),
            seconds=time.perf_counter() - t0,
        )


@dataclass(frozen=True)
class OptimizerProfile:
    """Bytes of the AdamW step of a model: its transient is what ``step()`` allocates above
    the live bytes before it (foreach temporaries); it does not depend on the batch."""

    param_bytes: int
    state_bytes: int
    transient_bytes: int


@functools.lru_cache(maxsize=8)
def optimizer_profile(model_name: str, round_to: int = CUDA_ROUNDING) -> OptimizerProfile:
    """Run two AdamW steps of ``model_name`` on fake tensors; measure the second."""
    tracker = Ledger(round_to)
    with _tracking_fake_mode(tracker):
        model = build_model(model_name)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = make_optimizer(model)
    optimizer.step()  # allocates the state
    before = tracker.current
    tracker.reset_peak()
    optimizer.step()
    transient = tracker.peak - before
    state = [v for s in optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    prof = OptimizerProfile(_storage_bytes(params), _storage_bytes(state), transient)
    return prof


@dataclass(frozen=True)
class Trace:
    """One fake forward + loss + backward: raw storage sizes (bytes, by allocation id), the
    event log (``i`` allocated, ``~i`` freed), and where each allocation came from: ids
    below ``n_build`` were made building the model and the batch, ids below ``n_state``
    are the AdamW state, ``grad_ids`` hold the parameters' gradients."""

    sizes: list[int]
    events: list[int]
    n_build: int
    n_state: int
    grad_ids: frozenset[int]


def trace_forward_backward(
    model_name: str,
    shape: Shape,
    batch_size: int,
    round_to: int,
    autocast_dtype: torch.dtype | None,
    loss_mode: str = "batched",
) -> Trace:
    """Trace forward + loss + backward of a fresh fake model with its AdamW state (two fp32
    tensors per parameter) allocated, as in every step after the first."""
    tracker = Ledger(round_to)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # frees must follow reference counts, not the cyclic collector's timing
    try:
        return _trace_with(tracker, model_name, shape, batch_size, autocast_dtype, loss_mode)
    finally:
        if gc_was_enabled:
            gc.enable()


def _trace_with(
    tracker: Ledger,
    model_name: str,
    shape: Shape,
    batch_size: int,
    autocast_dtype: torch.dtype | None,
    loss_mode: str = "batched",
) -> Trace:
    with _tracking_fake_mode(tracker):
        model = build_model(model_name)
        n_mels, vocab = model_input_spec(model)
        batch = synthetic_batch(batch_size, shape, n_mels, vocab)
    n_build = len(tracker.sizes)
    model.train()
    state = [torch.zeros_like(p) for p in model.parameters() for _ in range(2)]
    n_state = len(tracker.sizes)
    with torch.autocast("cpu", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        value = loss(model, batch.features, batch.feature_lens, batch.tokens, batch.token_lens, loss_mode)
    value.backward()
    grads = {tracker.alloc_id(p.grad) for p in model.parameters() if p.grad is not None}
    trace = Trace(list(tracker.sizes), list(tracker.events), n_build, n_state,
                  frozenset(g for g in grads if g is not None))
    del state, value
    return trace


def canonical(events: list[int]) -> list[int]:
    """Sort each run of consecutive frees: their order within the run (which can follow
    memory addresses) does not change any live total seen at an allocation."""
    out: list[int] = []
    run: list[int] = []
    for e in events:
        if e < 0:
            run.append(e)
            continue
        out.extend(sorted(run))
        run.clear()
        out.append(e)
    out.extend(sorted(run))
    return out


class ShapeEstimator:
    """Peak memory of the training step at any batch size for one bucket shape.

    Every storage the step allocates has a size affine in the batch size (its shape is
    either batch-free or has the batch as one factor), and the order of allocations and
    frees does not depend on the batch size (for batches > 1). So two fake traces (batch 2
    and 3) give each
    storage's size ``c + d * B``; the live total after each event, and so the peak, follows
    for any ``B`` in microseconds (for ``B = 1`` it is an upper bound). The forward/backward peak is combined with the optimizer
    step (live bytes after backward + the step's transient).
    """

    def __init__(
        self,
        model_name: str,
        shape: Shape,
        round_to: int = CUDA_ROUNDING,
        autocast_dtype: torch.dtype | None = torch.bfloat16,
        loss_mode: str = "batched",
    ) -> None:
        t0 = time.perf_counter()
        self.round_to = max(1, round_to)
        # Batch 2 and 3, not 1: with a batch of one, some reshapes are views instead of copies.
        t2 = trace_forward_backward(model_name, shape, 2, self.round_to, autocast_dtype, loss_mode)
        t3 = trace_forward_backward(model_name, shape, 3, self.round_to, autocast_dtype, loss_mode)
        s2, s3 = t2.sizes, t3.sizes
        e2, e3 = canonical(t2.events), canonical(t3.events)
        if e2 != e3 or len(s2) != len(s3):
            raise RuntimeError(
                f"{model_name}: the step allocates differently at batch 2 and 3; "
                "the affine estimate does not apply (use run_step_tracked)"
            )
        a2 = np.asarray(s2, dtype=np.int64)
        a3 = np.asarray(s3, dtype=np.int64)
        self.slope = a3 - a2
        self.const = a2 - 2 * self.slope
        e1 = e2
        ev = np.asarray(e1, dtype=np.int64)
        self.alloc = ev >= 0
        self.ids = np.where(self.alloc, ev, ~ev)
        self.optimizer = optimizer_profile(model_name, self.round_to)
        self.seconds = time.perf_counter() - t0

    def breakdown(self, batch_size: int) -> tuple[int, int]:
        """(forward/backward peak, live bytes after backward) at ``batch_size``."""
        raw = np.maximum(self.const + self.slope * batch_size, 0)
        sizes = -(-raw // self.round_to) * self.round_to
        deltas = np.where(self.alloc, sizes[self.ids], -sizes[self.ids])
        live = np.cumsum(deltas)
        return int(live.max(initial=0)), int(live[-1]) if live.size else 0

    def peak(self, batch_size: int) -> int:
        """Estimated peak bytes of a steady-state training step at ``batch_size``."""
        fwd_bwd, after = self.breakdown(batch_size)
        return max(fwd_bwd, after + self.optimizer.transient_bytes)


@functools.lru_cache(maxsize=256)
def shape_estimator(model_name: str, shape: Shape, loss_mode: str = "batched") -> ShapeEstimator:
    """:class:`ShapeEstimator` of ``model_name`` for ``shape``, built once per process."""
    return ShapeEstimator(model_name, shape, loss_mode=loss_mode)
