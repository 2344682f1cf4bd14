"""The fast estimate: the step's memory as a function of (batch, frames, tokens) from one trace.

Every storage the step allocates has ``c * B^a * T^b * T2^c * T4^d * T8^e * U^f * (U+1)^g``
bytes (B batch, T feature frames, T2 / T4 / T8 frames after each stride-2 subsampling stage,
U tokens, ``c`` model constants), in an order that does not depend on the shape. One fake
trace at a tagged shape, each factor a distinct prime above 2000, gives each storage's law by
factoring its size; a cofactor that is not 2000-smooth raises :class:`FitError` (the caller
falls back to full traces). A bucket is then evaluated as a trace at its shape would be
(sizes rounded to 512 bytes, peak of the running live total, AdamW step as
:class:`oom.estimate.ShapeEstimator`): one trace per model, then milliseconds per bucket.
:meth:`FittedModel.check_against` compares with full traces (tests do); at batch 1 the fitted
peak is an upper bound.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from oom.estimate import (
    CUDA_ROUNDING,
    OptimizerProfile,
    ShapeEstimator,
    Trace,
    canonical,
    optimizer_profile,
    trace_forward_backward,
)
from oom.models import is_transducer
from oom.step import Shape

SYMBOLS = ("B", "T", "T2", "T4", "T8", "U", "U1")
#: Prime tag of each symbol (U1 = U + 1 = 2 * 2011: its tag is the odd half).
TAGS = (2003, 17041, 8521, 4261, 2131, 4021, 2011)
TAG_BATCH = 2003
TAG_SHAPE = Shape(frames=17041, tokens=4021)
_SMOOTH = 2000


class FitError(RuntimeError):
    """A storage size that is not a monomial of the shape symbols times model constants."""


def symbol_values(batch_size: int, shape: Shape) -> np.ndarray:
    """(7,) int64: B, T, T2, T4, T8, U, U + 1 for a batch of ``shape``."""
    t2 = (shape.frames - 1) // 2 + 1
    t4 = (t2 - 1) // 2 + 1
    t8 = (t4 - 1) // 2 + 1  # = subsampled_length(frames)
    return np.array([batch_size, shape.frames, t2, t4, t8, shape.tokens, shape.tokens + 1], dtype=np.int64)


def _is_smooth(n: int) -> bool:
    p = 2
    while p * p <= n and p < _SMOOTH:
        while n % p == 0:
            n //= p
        p += 1
    return n < _SMOOTH


@functools.lru_cache(maxsize=65536)
def size_law(nbytes: int) -> tuple[int, tuple[int, ...]] | None:
    """(coefficient, exponents over :data:`SYMBOLS`) of a size traced at the tagged shape,
    or None when the cofactor is not a product of model constants."""
    n = nbytes
    exps = []
    for p in TAGS:
        e = 0
        while n and n % p == 0:
            n //= p
            e += 1
        exps.append(e)
    two = 1 << exps[-1]  # each U + 1 factor also brought a 2
    if n % two or not _is_smooth(n // two if n else 1):
        return None
    return n // two, tuple(exps)


@dataclass(frozen=True)
class Breakdown:
    """Live bytes by class at the step's peak (see :meth:`FittedModel.explain`)."""

    peak_bytes: int
    phase: str  # "forward/backward" or "optimizer step"
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    attention: int
    joint: int

    def to_json(self) -> dict[str, int | str]:
        return dict(self.__dict__)


CLASSES = ("parameters", "gradients", "optimizer", "activations", "attention", "joint")


class FittedModel:
    """Size laws and event log of one model's training step (one tagged trace)."""

    def __init__(
        self,
        model_name: str,
        loss_mode: str = "batched",
        round_to: int = CUDA_ROUNDING,
        autocast_dtype: torch.dtype | None = torch.bfloat16,
    ) -> None:
        t0 = time.perf_counter()
        self.model_name, self.loss_mode = model_name, loss_mode
        self.round_to = max(1, round_to)
        self.autocast_dtype = autocast_dtype
        trace = trace_forward_backward(model_name, TAG_SHAPE, TAG_BATCH, self.round_to, autocast_dtype, loss_mode)
        laws = [size_law(s) for s in trace.sizes]
        bad = [(i, s) for i, (s, law) in enumerate(zip(trace.sizes, laws)) if law is None]
        if bad:
            raise FitError(f"{model_name}: {len(bad)} storage sizes are not shape monomials (first: #{bad[0][0]}, {bad[0][1]} bytes)")
        self.coef = np.array([c for c, _ in laws], dtype=np.int64)  # type: ignore[misc]
        exps = np.array([e for _, e in laws], dtype=np.int64).reshape(-1, len(SYMBOLS))  # type: ignore[misc]
        self.monomials, self.which = np.unique(exps, axis=0, return_inverse=True)
        self.which = self.which.reshape(-1)
        self.exps = exps
        ev = np.asarray(canonical(trace.events), dtype=np.int64)
        self.alloc = ev >= 0
        self.ids = np.where(self.alloc, ev, ~ev)
        self.classes = self._classify(trace, exps)
        self.optimizer: OptimizerProfile = optimizer_profile(model_name, self.round_to)
        self.seconds = time.perf_counter() - t0

    def _classify(self, trace: Trace, exps: np.ndarray) -> np.ndarray:
        """Class index (into :data:`CLASSES`) of every allocation."""
        n = len(trace.sizes)
        ids = np.arange(n)
        seq = exps[:, 1:]  # T.. U1
        t8, u, u1 = exps[:, 4], exps[:, 5], exps[:, 6]
        quadratic = (seq.max(axis=1) >= 2) | ((t8 >= 1) & ((u + u1) >= 1))
        cls = np.full(n, CLASSES.index("activations"))
        if is_transducer(self.model_name):
            cls[(t8 >= 1) & ((u + u1) >= 1)] = CLASSES.index("joint")
            cls[(seq.max(axis=1) >= 2) & ~((t8 >= 1) & ((u + u1) >= 1))] = CLASSES.index("attention")
        else:
            cls[quadratic] = CLASSES.index("attention")
        batch_free = exps.sum(axis=1) == 0
        cls[(ids < trace.n_build) & batch_free] = CLASSES.index("parameters")
        cls[(ids >= trace.n_build) & (ids < trace.n_state)] = CLASSES.index("optimizer")
        cls[np.fromiter(trace.grad_ids, dtype=np.int64, count=len(trace.grad_ids))] = CLASSES.index("gradients")
        return cls

    def sizes(self, batch_size: int, shape: Shape) -> np.ndarray:
        """(allocations,) int64 bytes, rounded to the allocator block."""
        vals = symbol_values(batch_size, shape)
        mono = np.prod(vals[None, :] ** self.monomials, axis=1)
        raw = self.coef * mono[self.which]
        return -(-raw // self.round_to) * self.round_to

    def _live(self, batch_size: int, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
        sizes = self.sizes(batch_size, shape)
        deltas = np.where(self.alloc, sizes[self.ids], -sizes[self.ids])
        return deltas, np.cumsum(deltas)

    def peak(self, batch_size: int, shape: Shape) -> int:
        """Estimated peak bytes of a steady-state training step."""
        _, live = self._live(batch_size, shape)
        fwd_bwd = int(live.max(initial=0))
        after = int(live[-1]) if live.size else 0
        return max(fwd_bwd, after + self.optimizer.transient_bytes)

    def explain(self, batch_size: int, shape: Shape) -> Breakdown:
        """Live bytes by class at the peak: of forward/backward, or of the optimizer step
        (live after backward + the AdamW transient, counted as optimizer)."""
        deltas, live = self._live(batch_size, shape)
        fwd_idx = int(live.argmax()) if live.size else 0
        after = int(live[-1]) if live.size else 0
        opt_peak = after + self.optimizer.transient_bytes
        idx, phase = (fwd_idx, "forward/backward") if live[fwd_idx] >= opt_peak else (len(live) - 1, "optimizer step")
        cls = self.classes[self.ids[: idx + 1]]
        by = np.bincount(cls, weights=deltas[: idx + 1].astype(np.float64), minlength=len(CLASSES)).astype(np.int64)
        parts = {c: int(by[i]) for i, c in enumerate(CLASSES)}
        if phase == "optimizer step":
            parts["optimizer"] += self.optimizer.transient_bytes
        return Breakdown(peak_bytes=sum(parts.values()), phase=phase, **parts)

    def check_against(self, trace_shape: Shape, batch_size: int) -> float:
        """Relative difference of the fitted peak vs a full untagged trace at one shape."""
        exact = ShapeEstimator(self.model_name, trace_shape, self.round_to, self.autocast_dtype, self.loss_mode)
        ref = exact.peak(batch_size)
        return abs(self.peak(batch_size, trace_shape) - ref) / ref


@functools.lru_cache(maxsize=16)
def fitted_model(model_name: str, loss_mode: str = "batched") -> FittedModel:
    """:class:`FittedModel` of ``model_name``, traced once per process."""
    return FittedModel(model_name, loss_mode)
