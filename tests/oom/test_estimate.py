from __future__ import annotations

import itertools
import json

import pytest
import torch
from typer.testing import CliRunner

from dataprep.cli import app
from oom.estimate import ShapeEstimator, run_step_tracked, shape_estimator
from oom.models import build_model, loss, subsampled_length
from oom.step import Shape

SHAPE = Shape.of_bucket(3.0, 24)  # 301 frames, 24 tokens


@pytest.fixture(scope="module")
def estimator() -> ShapeEstimator:
    return shape_estimator("tiny", SHAPE)  # shared with the CLI run in this process


def test_model_forward_shapes_and_padding_mask() -> None:
    torch.manual_seed(0)
    m = build_model("tiny").eval()
    feats = torch.randn(2, 301, 16)
    toks = torch.randint(1, 128, (2, 9))
    logits = m(feats, torch.tensor([301, 120]), toks, torch.tensor([9, 4]))
    assert logits.shape == (2, 9, 128)
    assert int(subsampled_length(301)) == 38
    # padding after a row's length does not change its real positions
    feats2 = feats.clone()
    feats2[1, 200:] = 99.0
    toks2 = toks.clone()
    toks2[1, 6:] = 5
    logits2 = m(feats2, torch.tensor([301, 120]), toks2, torch.tensor([9, 4]))
    torch.testing.assert_close(logits[1, :4], logits2[1, :4], rtol=1e-4, atol=1e-4)
    value = loss(m.train(), feats, torch.tensor([301, 120]), toks, torch.tensor([9, 4]))
    assert torch.isfinite(value)


def test_exact_bytes_and_fake_matches_real_cpu_step() -> None:
    est = run_step_tracked("tiny", SHAPE, 3, fake=True, round_to=1)
    params = sum(p.numel() * 4 for p in build_model("tiny").parameters())
    assert est.param_bytes == params
    assert est.grad_bytes == params
    assert est.optimizer_bytes == 2 * params  # AdamW: exp_avg + exp_avg_sq, fp32
    batch = 3 * SHAPE.frames * 16 * 4 + 3 * (SHAPE.tokens + 1) * 8 + 2 * 3 * 8
    # after the step: parameters, gradients, optimizer state and the batch (+ scalars)
    assert 0 <= est.resident_bytes - (4 * params + batch) <= 4096
    assert est.peak_bytes > est.resident_bytes
    # The same step on real CPU tensors (real kernels allocate what they return) vs fake.
    real = run_step_tracked("tiny", SHAPE, 3, fake=False, round_to=1)
    assert abs(est.peak_bytes - real.peak_bytes) <= 0.05 * real.peak_bytes
    assert est.param_bytes == real.param_bytes and est.optimizer_bytes == real.optimizer_bytes


def test_affine_estimator_equals_direct_fake_run(estimator: ShapeEstimator) -> None:
    for b in (5,):
        direct = run_step_tracked("tiny", SHAPE, b, fake=True).peak_bytes
        assert abs(estimator.peak(b) - direct) <= 0.01 * direct
    peaks = [estimator.peak(b) for b in range(1, 64)]
    assert all(a < b for a, b in itertools.pairwise(peaks))


def test_cli_estimate_end_to_end(tmp_path, estimator: ShapeEstimator) -> None:
    src = tmp_path / "buckets.json"
    src.write_text(json.dumps({"version": 1, "buckets": [
        {"index": 0, "max_duration": 1.5, "max_tokens": 12, "hours": 1.0},
        {"index": 1, "max_duration": 3.0, "max_tokens": 24, "hours": 2.0},
    ]}))
    out = tmp_path / "sized.json"
    args = ["oomptimize", str(src), "--model", "tiny", "--estimate", "--gpu-memory", "40MiB",
            "--tolerance", "0", "--cache-dir", str(tmp_path / "cache"), "-o", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    src_info = data["batch_size_source"]
    assert src_info["rule"] == "oom-estimate" and src_info["memory_fraction"] == 0.9
    assert "target frames" in src_info["dynamic_resolution"]  # plan-batches --dynamic-resolution: same worst case
    budget = src_info["budget_bytes"]
    assert budget == int(0.9 * 40 * 2**20) - int(0.05 * 40 * 2**20)
    b0, b1 = data["buckets"]
    assert b0["hours"] == 1.0  # other fields kept
    assert b0["batch_size"] >= b1["batch_size"] >= 1
    # bucket 1 has the estimator's shape: its batch is the largest within the budget
    assert estimator.peak(b1["batch_size"]) <= budget < estimator.peak(b1["batch_size"] + 1)
    assert b1["oom_peak_bytes"] == estimator.peak(b1["batch_size"])
    # a re-run is answered from the cache and writes the same file
    first = out.read_bytes()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and out.read_bytes() == first


def test_cli_estimate_needs_gpu_memory(tmp_path) -> None:
    src = tmp_path / "buckets.json"
    src.write_text(json.dumps({"version": 1, "buckets": [{"index": 0, "max_duration": 1.0}]}))
    r = CliRunner().invoke(app, ["oomptimize", str(src), "--model", "tiny", "--estimate", "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 2 and "--gpu-memory" in r.output
    r = CliRunner().invoke(app, ["oomptimize", str(src), "--model", "nope", "--estimate", "--gpu-memory", "1GiB",
                                 "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 2 and "not a known model" in r.output
