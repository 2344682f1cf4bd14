"""Identical-bucket steps planned from per-batch figures (bucketing/plan_summary.py) are the
in-memory planner's epoch, less its rows: the same steps, offsets, longest, most tokens, real
sums, fallbacks and dropped rows, reading rows only for the tails it pools, carries or borrows."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bucketing.batching import form_batches
from bucketing.plan import PlanInputs, plan_epoch
from bucketing.plan_summary import ROW_DTYPE, FormedBatches, plan_identical_summaries
from tests.bucketing.test_plan import _inputs


def _from_figures(inp: PlanInputs, W: int, seed: int, epoch: int) -> tuple[object, list[int]]:
    """The epoch planned from the formed batches' figures; and how many rows were read."""
    fb = form_batches(inp.bucket_of_row, inp.batch_sizes, np.random.default_rng([seed, epoch, 0]),
                      num_tokens=inp.num_tokens, duration=inp.durations)
    st_ = fb.offsets[:-1]
    dr, tr = inp.durations[fb.rows], np.asarray(inp.num_tokens, np.int64)[fb.rows]
    formed = FormedBatches(fb.bucket, fb.sizes(), np.maximum.reduceat(dr, st_), np.maximum.reduceat(tr, st_),
                           np.add.reduceat(dr, st_), np.add.reduceat(tr, st_))
    read: list[int] = []

    def read_rows(lo: int, hi: int) -> npt.NDArray[np.void]:
        assert (fb.bucket[lo:hi] == fb.bucket[lo]).all()  # one bucket's batches at a time
        r = fb.rows[fb.offsets[lo]:fb.offsets[hi]]
        out = np.empty(r.shape[0], ROW_DTYPE)
        out["row"], out["d"], out["t"] = r, inp.durations[r], inp.num_tokens[r]
        read.append(int(r.shape[0]))
        return out

    ep = plan_identical_summaries(formed, inp.batch_sizes, W, seed, epoch, read_rows,
                                  max_duration=inp.max_duration, max_tokens=inp.max_tokens)
    return ep, read


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), n=st.integers(40, 500), buckets=st.integers(1, 6),
       max_bs=st.integers(1, 24), world=st.integers(1, 24), two_d=st.booleans(), epoch=st.integers(0, 2))
@example(seed=0, n=40, buckets=3, max_bs=1, world=8, two_d=True, epoch=0)  # carried, borrowed and dropped
@example(seed=1, n=200, buckets=1, max_bs=1, world=7, two_d=False, epoch=0)  # 1 bucket, bs 1, 200 % 7 != 0
def test_figures_plan_equals_the_in_memory_plan(seed: int, n: int, buckets: int, max_bs: int, world: int,
                                                two_d: bool, epoch: int) -> None:
    inp = _inputs(seed, n, buckets, max_bs, two_d)
    if (inp.bucket_of_row >= 0).sum() < world:
        return
    want = plan_epoch(inp, world, seed, epoch)
    got, read = _from_figures(inp, world, seed, epoch)
    for name in ("step_bucket", "offsets", "max_duration", "max_tokens", "dropped"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert (got.real_seconds, got.real_tokens) == (want.real_seconds, want.real_tokens)
    assert (got.fallbacks, got.resplit_buckets) == (want.fallbacks, want.resplit_buckets)
    assert got.rows.shape[0] == 0
    # rows read: each bucket's tail at most (a step of batches and what is carried or borrowed)
    assert sum(read) <= (want.resplit_buckets + len(want.fallbacks)) * world * int(np.max(inp.batch_sizes)) * 2


def test_borrowed_and_dropped_rows_are_the_in_memory_ones() -> None:
    """The pinned tiny-bucket case carries, borrows and drops (so the property above covers all three)."""
    inp = _inputs(0, 40, 3, 1, True)
    got, _ = _from_figures(inp, 8, 0, 0)
    assert {f["kind"] for f in got.fallbacks} == {"carried", "borrowed", "dropped"}
    assert got.dropped.shape[0] and np.array_equal(got.dropped, plan_epoch(inp, 8, 0, 0).dropped)
