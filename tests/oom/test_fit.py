from __future__ import annotations

import dataclasses

import pytest

from manifests.buckets_file import Bucket, BucketSpec
from manifests.errors import DataprepError, OptionError
from oom.estimate import ShapeEstimator
from oom.fit import CLASSES, TAGS, FittedModel, fitted_model, size_law, symbol_values
from oom.optimize import oomptimize
from oom.options import OomOptions
from oom.step import Shape


def test_size_law_factors_tag_primes_and_rejects_foreign_factors() -> None:
    b, t8, u1_half = TAGS[0], TAGS[4], TAGS[6]
    # bf16 (2 bytes) x B x T' x (U + 1) x 1025 outputs
    assert size_law(2 * b * t8 * (2 * u1_half) * 1025) == (2 * 1025, (1, 0, 0, 0, 1, 0, 1))
    assert size_law(4 * 1024 * 4096) == (4 * 1024 * 4096, (0,) * 7)
    assert size_law(4 * b * 10007) is None  # 10007: a prime that is neither a tag nor small
    assert list(symbol_values(3, Shape(301, 24))) == [3, 301, 151, 76, 38, 24, 25]


@pytest.mark.parametrize(
    ("name", "mode", "shape", "batch"),
    [("tiny", "batched", Shape(517, 33), 5), ("tiny-rnnt", "sample-wise", Shape(1202, 61), 3)],
)
def test_fitted_peak_equals_full_traces_on_held_out_shapes(name: str, mode: str, shape: Shape, batch: int) -> None:
    fm = fitted_model(name, mode)
    for shape, batch in [(shape, batch)]:
        exact = ShapeEstimator(name, shape, loss_mode=mode)
        for b in (batch, 4 * batch):
            assert fm.peak(b, shape) == exact.peak(b)
        br = fm.explain(batch, shape)
        assert br.peak_bytes == fm.peak(batch, shape)
        assert sum(br.to_json()[c] for c in CLASSES) == br.peak_bytes  # type: ignore[misc]


def test_explain_shows_the_joint_and_what_sample_wise_saves() -> None:
    shape, b = Shape(801, 60), 16
    batched = fitted_model("tiny-rnnt", "batched").explain(b, shape)
    sample = fitted_model("tiny-rnnt", "sample-wise").explain(b, shape)
    assert batched.joint > batched.activations and batched.joint > batched.attention
    assert sample.joint < batched.joint / 4
    assert batched.parameters == sample.parameters > 0
    # exp_avg + exp_avg_sq per fp32 parameter; "parameters" also holds the batch-norm buffers
    assert 1.95 * batched.parameters <= batched.optimizer <= 2 * batched.parameters
    enc_dec = fitted_model("tiny", "batched").explain(b, shape)
    assert enc_dec.joint == 0 and enc_dec.attention > 0


def _spec(*durations: float) -> BucketSpec:
    buckets = tuple(Bucket(index=i, max_duration=d, max_tokens=int(d * 8) + 2) for i, d in enumerate(durations))
    return BucketSpec(buckets=buckets)


def test_oomptimize_transducer_modes_fitted_equals_exact_and_explain(tmp_path) -> None:
    spec = _spec(2.0, 8.0)
    common = {"estimate": True, "gpu_memory": 200 * 2**20, "tolerance": 0.0, "cache_dir": str(tmp_path)}
    sized = {m: oomptimize(spec, OomOptions("tiny-rnnt", loss_mode=m, explain=True, **common)) for m in ("batched", "sample-wise")}
    for mode, s in sized.items():
        assert s.batch_size_source["loss_mode"] == mode and s.batch_size_source["estimator"] == "fitted"
        for bk in s.buckets:
            assert bk.extra["oom_breakdown"]["peak_bytes"] == bk.extra["oom_peak_bytes"] <= s.batch_size_source["budget_bytes"]
    long_b, long_s = sized["batched"].buckets[1], sized["sample-wise"].buckets[1]
    assert long_s.batch_size > 1.5 * long_b.batch_size  # the joint no longer rules the long bucket
    exact = oomptimize(spec, OomOptions("tiny-rnnt", loss_mode="sample-wise", exact_trace=True, **common))
    assert exact.batch_size_source["estimator"] == "exact-trace"
    assert [b.batch_size for b in exact.buckets] == [b.batch_size for b in sized["sample-wise"].buckets]


def test_loss_mode_is_for_transducers_only() -> None:
    with pytest.raises(DataprepError, match="only transducer"):
        oomptimize(_spec(1.0), OomOptions("tiny", loss_mode="sample-wise", estimate=True, gpu_memory=2**30))
    with pytest.raises(OptionError, match="loss_mode: must be batched or sample-wise"):
        OomOptions("tiny-rnnt", loss_mode="fused", estimate=True, gpu_memory=2**30)


def test_fitted_model_is_deterministic() -> None:
    a = fitted_model("tiny", "batched")
    b = FittedModel("tiny", "batched")
    assert (a.coef == b.coef).all() and (a.ids == b.ids).all()
    assert dataclasses.asdict(a.explain(7, Shape(333, 20))) == dataclasses.asdict(b.explain(7, Shape(333, 20)))
