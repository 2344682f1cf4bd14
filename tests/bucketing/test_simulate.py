"""SYNC / ADPSGD / HYBRID step times against an example worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bucketing.simulate import simulate_strategy

#: seconds of compute of each (step, rank): rank 1 is slow at step 0, rank 0 at step 2
COMPUTE = np.array([[1.0, 5.0, 1.0],
                    [1.0, 1.0, 1.0],
                    [3.0, 1.0, 1.0]])
SIZES = np.ones((3, 3), dtype=np.int64)
EXCHANGE = 0.5


def test_adpsgd_ring_waits_for_the_neighbour() -> None:
    """3 learners on a ring, 3 steps, 0.5 s exchange. Learner i ends step s at
    max(its end of s-1 + its compute, the end of s-1 of learner i+1 mod 3) + 0.5::

        step 0: own (1, 5, 1)        neighbour (0, 0, 0)        -> (1.5, 5.5, 1.5)
        step 1: own (2.5, 6.5, 2.5)  neighbour (5.5, 1.5, 1.5)  -> (6.0, 7.0, 3.0)
        step 2: own (9.0, 8.0, 4.0)  neighbour (7.0, 3.0, 6.0)  -> (9.5, 8.5, 6.5)

    Epoch time 9.5 s (learner 0 waited 3 s at step 1 for learner 1); a ring that ignored the
    neighbour would end at 8.5 s (learner 1's own 7 s + 3 exchanges). Busy 15 s of 3 x 9.5:
    idle 1 - 15/28.5. Staleness 2: at 6.5 s learner 2 has ended 3 steps, learner 1 one.
    """
    r = simulate_strategy(COMPUTE, SIZES, "adpsgd", exchange=EXCHANGE)
    assert (r.world_size, r.group_size) == (3, 1)
    assert r.time == pytest.approx(9.5)
    assert r.idle == pytest.approx(1 - 15 / 28.5)
    assert r.utt_per_s == pytest.approx(9 / 9.5)
    assert r.staleness == 2


def test_hybrid_groups_are_learners_on_the_ring() -> None:
    """6 ranks in sync groups of 2: group q's step lasts as long as its slower rank (the
    COMPUTE of learner q; its other rank 0.5 s faster), so the groups are the ring above:
    epoch time 9.5 s, staleness 2. Busy 15 + (15 - 9 x 0.5) = 25.5 s of 6 x 9.5: idle 1 - 25.5/57."""
    times = np.repeat(COMPUTE, 2, axis=1)
    times[:, 1::2] -= 0.5
    r = simulate_strategy(times, np.ones((3, 6), dtype=np.int64), "hybrid", group_size=2, exchange=EXCHANGE)
    assert (r.world_size, r.group_size) == (6, 2)
    assert r.time == pytest.approx(9.5)
    assert r.idle == pytest.approx(1 - 25.5 / 57)
    assert r.utt_per_s == pytest.approx(18 / 9.5)
    assert r.staleness == 2


def test_sync_waits_for_the_slowest_rank_every_step() -> None:
    """Every step lasts its slowest rank's compute: 5 + 1 + 3 = 9 s (no exchange counted);
    idle 1 - 15/27; no staleness."""
    r = simulate_strategy(COMPUTE, SIZES, "sync", exchange=EXCHANGE)
    assert r.time == pytest.approx(9.0)
    assert r.idle == pytest.approx(1 - 15 / 27)
    assert r.staleness == 0
