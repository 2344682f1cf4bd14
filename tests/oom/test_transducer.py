from __future__ import annotations

import math

import pytest
import torch

from oom.estimate import run_step_tracked
from oom.lattice import rnnt_log_likelihood, tdt_log_likelihood
from oom.models import build_model, loss
from oom.step import Shape, synthetic_batch

B, T, U = 2, 4, 3


def _brute_force(blank: torch.Tensor, label: torch.Tensor, b: int, durations: tuple[int, ...] | None,
                 duration: torch.Tensor | None = None) -> float:
    """log-sum-exp over every alignment path, enumerated recursively."""
    paths: list[float] = []

    def walk(t: int, u: int, acc: float) -> None:
        if durations is None:  # RNN-T: blank advances a frame, a label stays on it
            if t == T - 1 and u == U:
                paths.append(acc + blank[b, t, u].item())
                return
            if t < T - 1:
                walk(t + 1, u, acc + blank[b, t, u].item())
            if u < U:
                walk(t, u + 1, acc + label[b, t, u].item())
            return
        assert duration is not None
        for k, d in enumerate(durations):
            lp_d = duration[b, t, u, k].item()
            if d >= 1 and u == U and t + d == T:
                paths.append(acc + blank[b, t, u].item() + lp_d)
            if d >= 1 and t + d < T:
                walk(t + d, u, acc + blank[b, t, u].item() + lp_d)
            if u < U and t + d < T:
                walk(t + d, u + 1, acc + label[b, t, u].item() + lp_d)

    walk(0, 0, 0.0)
    return math.log(sum(math.exp(p) for p in paths))


def test_rnnt_and_tdt_lattice_equal_brute_force() -> None:
    gen = torch.Generator().manual_seed(0)
    blank = torch.randn(B, T, U + 1, generator=gen).log_softmax(-1)
    label = torch.randn(B, T, U, generator=gen).log_softmax(-1)
    durations = (0, 1, 2)
    duration = torch.randn(B, T, U + 1, 3, generator=gen).log_softmax(-1)
    lens_t, lens_u = torch.full((B,), T), torch.full((B,), U)
    rnnt = rnnt_log_likelihood(blank, label, lens_t, lens_u)
    tdt = tdt_log_likelihood(blank, label, duration, durations, lens_t, lens_u)
    for b in range(B):
        assert rnnt[b].item() == pytest.approx(_brute_force(blank, label, b, None), abs=1e-9)
        assert tdt[b].item() == pytest.approx(_brute_force(blank, label, b, durations, duration), abs=1e-9)


def _no_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    return model.train()


@pytest.mark.parametrize("name", ["tiny-rnnt", "tiny-tdt"])
def test_sample_wise_gives_the_batched_loss_and_gradients(name: str) -> None:
    torch.manual_seed(0)
    model = _no_dropout(build_model(name))
    batch = synthetic_batch(3, Shape(121, 9), 16, 64)
    batch.feature_lens[1] = 90  # ragged lengths: padding must not leak into the loss
    batch.token_lens[2] = 6
    results = {}
    for mode in ("batched", "sample-wise"):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same attention-dropout draws in both modes
        value = loss(model, batch.features, batch.feature_lens, batch.tokens, batch.token_lens, mode)
        value.backward()
        results[mode] = (value.item(), [p.grad.clone() for p in model.parameters()])
    (v1, g1), (v2, g2) = results["batched"], results["sample-wise"]
    assert torch.isfinite(torch.tensor(v1)) and v1 == pytest.approx(v2, rel=1e-6)
    assert len(g1) == len(g2) == len(list(model.parameters()))
    assert max((a - b).abs().max().item() for a, b in zip(g1, g2)) <= 1e-5
    assert any(g.abs().max() > 0 for g in g1[-3:])  # the joint learns


def test_sample_wise_step_peaks_lower_on_real_cpu_tensors_and_fake_matches_real() -> None:
    shape = Shape(241, 47)  # T' = 31, U + 1 = 48: the joint dominates
    peaks = {}
    for mode in ("batched", "sample-wise"):
        real = run_step_tracked("tiny-rnnt", shape, 6, fake=False, loss_mode=mode, autocast_dtype=None)
        fake = run_step_tracked("tiny-rnnt", shape, 6, fake=True, loss_mode=mode, autocast_dtype=None)
        # the fake path skips the lattice recursion's float64 temporaries (O(B T' U), a few
        # tens of bytes per lattice cell; < 1 % of a 1,025-way joint, not of this 65-way one)
        lattice_allowance = 16 * 8 * 6 * 31 * 48
        assert abs(fake.peak_bytes - real.peak_bytes) <= 0.05 * real.peak_bytes + lattice_allowance
        peaks[mode] = real.peak_bytes
    joint_fp32 = 6 * 31 * 48 * 65 * 4
    assert peaks["batched"] - peaks["sample-wise"] >= 2 * joint_fp32


def test_parakeet_layouts() -> None:
    counts = {}
    for name in ("parakeet-rnnt-0.6b", "parakeet-tdt-0.6b", "parakeet-tdt-1.1b"):
        with torch.device("meta"):
            model = build_model(name)
        counts[name] = sum(p.numel() for p in model.parameters())
        assert model.joint.out.out_features == 1025 + (5 if "tdt" in name else 0)
    assert 0.55e9 < counts["parakeet-rnnt-0.6b"] < 0.65e9
    # TDT: 5 duration outputs of the joint (640 weights + bias each); 128 vs 80 mels widen
    # the subsampling's output projection from 256 x 10 to 256 x 16 inputs
    assert counts["parakeet-tdt-0.6b"] - counts["parakeet-rnnt-0.6b"] == 5 * 641 + 256 * (16 - 10) * 1024
    assert 0.95e9 < counts["parakeet-tdt-1.1b"] < 1.15e9
