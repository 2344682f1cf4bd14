"""Dynamic-resolution math (bucketing.dynres): target frames, rates, clamps, per-batch fallback,
their totals and the SpecAugment width helper; hand-computed cases plus properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.dynres import (
    LONGEST,
    DynResConfig,
    batch_targets,
    bucket_frames,
    comparison_rows,
    policy_totals,
    ResolutionTotals,
    frames_at_rate,
    resolution_totals,
    resolve,
    target_frames,
    time_mask_widths,
)
from manifests.errors import OptionError

CFG = DynResConfig()


def test_target_is_the_longest_at_the_base_rate_as_oom_sizes_it() -> None:
    # oom.step: frames = floor(max_duration * 100 + 1e-6) + 1
    assert target_frames([10.0, 0.01, 3.456, 0.004]).tolist() == [1001, 2, 346, 1]
    assert target_frames([2.0], 50.0).tolist() == [101]


def test_hand_computed_batch_with_a_clamp() -> None:
    # batch 0: 10 s and 9.5 s fit the target (rates 100 and 105.26 Hz); 5 s needs 200 Hz,
    # clamped to 130 Hz -> 1 + floor(650) = 651 frames, zero-padded to 1001
    res = resolve([10.0, 9.5, 5.0], [0, 3])
    assert res.target.tolist() == [1001] and res.length.tolist() == [1001]
    np.testing.assert_allclose(res.rate, [100.0, 1000 / 9.5, 130.0])
    assert res.frames.tolist() == [1001, 1001, 651]
    assert res.clamped.tolist() == [False, False, True]
    assert res.fallback.tolist() == [False]
    np.testing.assert_allclose(res.hop(), [160.0, 16000 * 9.5 / 1000, 16000 / 130])
    t = resolution_totals([10.0, 9.5, 5.0], [0, 3], res)[0]
    assert t.real_frames == 2653 and t.padded_frames == 3003
    assert t.base_frames == 1001 + 951 + 501 and t.base_padded_frames == 3003
    assert t.off_rate_frames == 651  # 105.26 Hz is within 10% of 100 Hz, 130 Hz is not
    assert (t.clamped, t.utterances, t.fallback_batches, t.batches) == (1, 3, 0, 1)


def test_a_target_below_the_floor_falls_back_to_padding_at_the_base_rate() -> None:
    # a 300-frame target for 10 s needs 29.9 Hz < 50 Hz: the whole batch at 100 Hz, padded
    res = resolve([10.0, 5.0, 3.0, 2.0], [0, 2, 4], target=[300, 301])
    assert res.fallback.tolist() == [True, False]
    assert res.rate[:2].tolist() == [100.0, 100.0] and res.frames[:2].tolist() == [1001, 501]
    assert res.length[0] == 1001  # ordinary padding: the longest
    assert not res.clamped[:2].any()
    # batch 1 (target 301): 3 s -> 100 Hz, 2 s -> 150 Hz clamped to 130 -> 261 frames
    assert res.frames[2:].tolist() == [301, 261] and res.clamped[2:].tolist() == [False, True]


def test_the_min_clamp_lengthens_the_batch() -> None:
    # target 400 for 6 s needs 66.5 Hz: clamped up to 70 Hz -> 421 frames > 400
    res = resolve([6.0, 4.0], [0, 2], target=[400])
    assert res.clamped.tolist() == [True, False] and res.frames.tolist() == [421, 400]
    assert res.length.tolist() == [421] and not res.fallback[0]


def test_config_errors_are_one_line() -> None:
    with pytest.raises(OptionError, match="max_rate: must be >= 140"):
        DynResConfig(min_rate=140)
    with pytest.raises(OptionError, match="min_rate: must be >= 80"):
        DynResConfig(floor_rate=80)
    bad_fields = [("frames_per_second", math.inf), ("frames_per_second", math.nan), ("frames_per_second", 0),
                  ("min_rate", math.nan), ("max_rate", math.inf), ("floor_rate", -1.0), ("floor_rate", True),
                  ("max_rate", "130"), ("max_rate", 20000.0), ("sample_rate", 16000.0), ("sample_rate", 0),
                  ("sample_rate", True), ("target_frames", 799), ("target_frames", 1601), ("target_frames", 1000.0),
                  ("target_frames", True), ("target_frames", "1000"), ("target_frames", math.inf)]
    for field, value in bad_fields:
        with pytest.raises(OptionError) as err:
            DynResConfig(**{field: value})
        assert err.value.field == field, (field, value)
    with pytest.raises(ValueError, match="offsets"):
        resolve([1.0, 2.0], [0, 1])
    assert DynResConfig.from_json({**CFG.to_json(), "new_key": 1}) == CFG


def test_time_mask_widths_cover_the_same_seconds() -> None:
    assert time_mask_widths(40, [100.0, 130.0, 70.0, 115.0]).tolist() == [40, 52, 28, 46]
    assert time_mask_widths(0, [130.0]).tolist() == [0]
    with pytest.raises(ValueError):
        time_mask_widths(-1, [100.0])


batches_st = st.lists(
    st.lists(st.floats(min_value=0.02, max_value=40.0, allow_nan=False), min_size=0, max_size=12),
    min_size=1, max_size=8,
)


def _csr(batches: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    d = np.array([x for b in batches for x in b], dtype=np.float64)
    off = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.int64)
    return d, off


@settings(max_examples=150)
@given(batches=batches_st)
def test_with_the_default_target_every_unclamped_utterance_has_the_target_length(batches: list[list[float]]) -> None:
    d, off = _csr(batches)
    res = resolve(d, off)
    b = np.repeat(np.arange(len(batches)), np.diff(off))
    # the target is the longest at the base rate, inside [min, max]: rates >= base minus a
    # frame of rounding (> 50 Hz from 20 ms on), so nothing falls back and no batch grows
    assert not res.fallback.any()
    assert (res.length == res.target).all()
    ok = ~res.fallback[b]
    assert (res.frames <= res.target[b]).all()
    free = ok & ~res.clamped
    assert (res.frames[free] == res.target[b][free]).all()
    # a clamp only where the rate the target needs leaves [min, max], and it lands on a bound
    need = (res.target[b] - 1) / d
    assert (res.clamped[ok] == ((need[ok] > CFG.max_rate) | (need[ok] < CFG.min_rate))).all()
    assert np.isin(res.rate[res.clamped], [CFG.min_rate, CFG.max_rate]).all()
    assert ((res.rate[ok] >= CFG.min_rate) & (res.rate[ok] <= CFG.max_rate)).all()
    # frames at the rate actually used, never more than the batch tensor holds
    assert (res.frames <= res.length[b]).all()
    np.testing.assert_array_equal(res.frames[~free], frames_at_rate(d[~free], res.rate[~free]))


@settings(max_examples=150)
@given(batches=batches_st, data=st.data())
def test_vectorized_equals_batch_by_batch_and_totals_add_up(batches: list[list[float]], data: st.DataObject) -> None:
    d, off = _csr(batches)
    target = np.array(data.draw(st.lists(st.integers(1, 5000), min_size=len(batches), max_size=len(batches))))
    res = resolve(d, off, target)
    for i in range(len(batches)):
        one = resolve(d[off[i]:off[i + 1]], [0, off[i + 1] - off[i]], target[i:i + 1])
        sl = slice(off[i], off[i + 1])
        np.testing.assert_array_equal(one.frames, res.frames[sl])
        np.testing.assert_array_equal(one.rate, res.rate[sl])
        assert one.fallback[0] == res.fallback[i] and one.length[0] == res.length[i]
        # fallback exactly when some utterance would need less than the floor
        assert res.fallback[i] == bool(off[i + 1] > off[i] and ((target[i] - 1) / d[sl]).min() < CFG.floor_rate)
    groups = np.arange(len(batches)) % 3
    parts = resolution_totals(d, off, res, CFG, groups, 3)
    whole = resolution_totals(d, off, res, CFG)[0]
    assert sum(parts, ResolutionTotals()) == whole
    j = whole.to_json()
    assert 0.0 <= j["clamped_share"] <= 1 and 0.0 <= j["fallback_share"] <= 1 and 0.0 <= j["off_rate_share"] <= 1
    assert whole.padded_frames >= whole.real_frames


def test_a_constant_target_shortens_long_batches_and_lengthens_short_ones() -> None:
    cfg = DynResConfig(target_frames=1000)
    # 12 s -> 83.25 Hz: 1000 frames instead of 1201; 8 s -> 124.9 Hz: 1000 instead of 801;
    # 5 s would need 199.8 Hz: clamped to 130 Hz -> 651 frames, zero-padded to 1000
    res = resolve([12.0, 11.0, 8.0, 5.0], [0, 2, 4], config=cfg)
    assert res.target.tolist() == [1000, 1000] and res.length.tolist() == [1000, 1000]
    assert res.frames.tolist() == [1000, 1000, 1000, 651]
    assert res.clamped.tolist() == [False, False, False, True]
    np.testing.assert_allclose(res.rate[:3], [999 / 12, 999 / 11, 999 / 8])
    # 16 s needs 62.4 Hz: clamped up to 70 Hz (1121 frames, the batch grows);
    # 25 s needs 40 Hz < 50 Hz: the batch falls back to 100 Hz and ordinary padding
    res = resolve([16.0, 25.0, 20.0], [0, 1, 3], config=cfg)
    assert res.frames.tolist() == [1121, 2501, 2001] and res.length.tolist() == [1121, 2501]
    assert res.fallback.tolist() == [False, True] and res.clamped.tolist() == [True, False, False]
    assert batch_targets([3.0, 30.0], cfg).tolist() == [1000, 1000]
    assert batch_targets([3.0], CFG).tolist() == [301]


def test_bucket_frames_is_the_shape_of_each_policy() -> None:
    cfg = DynResConfig(target_frames=1000)
    # 7.68-14.27 s: F; 14.27-19.98 s: clamped at 70 Hz; beyond: fallback at 100 Hz
    # 2 s needs 499.5 Hz: clamped to 130 Hz -> 261 frames (short buckets get larger batches)
    assert bucket_frames([2.0, 10.0, 14.0, 16.0, 25.0], cfg).tolist() == [261, 1000, 1000, 1121, 2501]
    assert bucket_frames([2.0, 10.0]).tolist() == [201, 1001]
    assert bucket_frames([2.0, 10.0], DynResConfig()).tolist() == [201, 1001]
    assert CFG.shape_policy() == {"target_frames": LONGEST, "frames_per_second": 100.0}
    assert cfg.shape_policy()["target_frames"] == 1000 and "min_rate" in cfg.shape_policy()
    for bad in (1, True, 1000.0, "1000", "short"):
        with pytest.raises(OptionError, match="target_frames"):
            DynResConfig(target_frames=bad)  # type: ignore[arg-type]
    assert DynResConfig.from_json(cfg.to_json()) == cfg


@settings(max_examples=200)
@given(batches=batches_st, F=st.integers(800, 1600), data=st.data())
def test_with_a_constant_target_every_utterance_has_f_frames_except_the_counted(
        batches: list[list[float]], F: int, data: st.DataObject) -> None:
    cfg = DynResConfig(target_frames=F)
    d, off = _csr(batches)
    res = resolve(d, off, config=cfg)
    b = np.repeat(np.arange(len(batches)), np.diff(off))
    fb = res.fallback[b]
    exact = res.frames == F
    # exactly F frames, except clamped or fallback utterances, which are all counted
    assert (exact | res.clamped | fb).all()
    assert not (res.clamped & fb).any()
    t = resolution_totals(d, off, res, cfg)[0]
    assert t.clamped == int(res.clamped.sum()) and t.fallback_batches == int(res.fallback.sum())
    assert t.padded_frames == int((np.diff(off) * res.length).sum())
    # the rate of the batch is (F - 1) / T for its longest utterance when not clamped
    for i in np.flatnonzero(np.diff(off) > 0):
        sl = slice(off[i], off[i + 1])
        T = d[sl].max()
        need = (F - 1) / T
        if need < cfg.floor_rate:
            assert res.fallback[i] and (res.rate[sl] == cfg.frames_per_second).all()
        elif cfg.min_rate <= need <= cfg.max_rate:
            assert res.length[i] == F and np.isclose(res.rate[sl][d[sl].argmax()], need)
        else:  # the longest is clamped: the batch is as long as its frames at the bound
            assert res.length[i] == frames_at_rate(T, np.clip(need, cfg.min_rate, cfg.max_rate))
        # the bucket shape oomptimize sizes (any bucket bound >= T) holds the batch
        bound = T + data.draw(st.floats(0.0, 5.0))
        assert res.length[i] <= bucket_frames([bound], cfg)[0]
    # fallback exactly where the longest needs less than the floor; clamps land on a bound
    assert np.isin(res.rate[res.clamped], [cfg.min_rate, cfg.max_rate]).all()


def test_the_policy_comparison_adds_up_over_the_same_batches() -> None:
    d, off = _csr([[12.0, 11.5, 11.0], [3.0, 2.9], [20.0, 19.0]])
    rows = comparison_rows(policy_totals(d, off))
    assert [r["policy"] for r in rows] == ["2d", "longest", "F=800", "F=1000", "F=1200", "F=1600"]
    two, longest, f1000 = rows[0], rows[1], rows[3]
    assert two["encoder_frames"] == 3 * 1201 + 2 * 301 + 2 * 2001
    assert longest["encoder_frames"] == two["encoder_frames"] and longest["frame_padding"] < two["frame_padding"]
    # F=1000: 12 s -> 1000 frames (83 Hz); 3 s -> 130 Hz clamped: a 391-frame batch; 20 s -> 49.95 Hz < floor: 2001
    assert f1000["encoder_frames"] == 3 * 1000 + 2 * 391 + 2 * 2001
    assert f1000["fallback_share"] == round(1 / 3, 6) and f1000["mean_batch"] == two["mean_batch"] == round(7 / 3, 6)
    assert 0 < f1000["off_rate_share"] <= 1
