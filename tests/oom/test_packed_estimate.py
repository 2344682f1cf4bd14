"""The packed speech-LLM estimate: static bytes against a real CPU step of the tiny model,
activations linear in N x sequences (no N^2 attention term), LoRA against full fine-tuning,
and ``dataprep oomptimize --pack`` as a user runs it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dataprep.cli import app
from manifests.buckets_file import Bucket, BucketSpec, write_buckets
from oom.packed_estimate import SPEECH_LLMS, packed_memory, sequence_bytes, speech_llm_shape, static_bytes

runner = CliRunner()
TINY = SPEECH_LLMS["tiny-speech-llm"]
QWEN = SPEECH_LLMS["canary-qwen-2.5b"]


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_static_bytes_match_a_real_step(lora_rank: int) -> None:
    """Gradients and AdamW states of a real CPU step of the tiny model (fp32) are the estimate's."""
    from oom.speech_llm import SpeechLLM

    shape = replace(TINY, lora_rank=lora_rank)
    torch.manual_seed(0)
    model = SpeechLLM(shape)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    opt.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    states = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    est = static_bytes(shape)
    assert grads == est["gradients"] and states == est["optimizer"]
    assert est["parameters"] == shape.trainable() * 4 + (sum(p.numel() for p in model.parameters()) - shape.trainable()) * 2


def test_activations_are_linear_in_tokens_and_sequences() -> None:
    one = packed_memory(QWEN, 4096, 1, 0.6)
    static = sum(static_bytes(QWEN).values())
    assert packed_memory(QWEN, 4096, 3, 0.6)["peak"] - static == 3 * (one["peak"] - static)
    # varlen attention: twice the tokens, twice the activations (no N^2 term)
    assert sequence_bytes(QWEN, 8192, 0.6) == {k: 2 * v for k, v in sequence_bytes(QWEN, 4096, 0.6).items()}


def test_lora_trains_fewer_parameters_than_full_fine_tuning() -> None:
    lora, full = speech_llm_shape("canary-qwen-2.5b"), speech_llm_shape("canary-qwen-2.5b", lora_rank=0)
    p = lora.param_counts()
    assert lora.trainable() == p["encoder"] + p["lora"] and full.trainable() == p["encoder"] + p["llm"]
    assert 1.5e9 < p["llm"] < 2.2e9  # Qwen3-1.7B's size, tied embeddings
    assert sum(static_bytes(lora).values()) < sum(static_bytes(full).values()) / 2


@pytest.fixture()
def buckets(tmp_path: Path) -> Path:
    spec = BucketSpec(tuple(Bucket(i, d, t, batch_size=1) for i, (d, t) in enumerate([(4.0, 40), (12.0, 120), (30.0, 300)])))
    path = tmp_path / "buckets.json"
    write_buckets(spec, path)
    return path


def test_cli_sizes_packed_batches(buckets: Path, tmp_path: Path) -> None:
    out = tmp_path / "sized.json"
    res = runner.invoke(app, ["oomptimize", str(buckets), "--model", "canary-qwen-2.5b", "--pack", "4096", "--estimate",
                              "--gpu-memory", "80GiB", "-o", str(out), "--explain"])
    assert res.exit_code == 0, res.output
    sized = json.loads(out.read_text())
    assert sized["batch_size_source"]["rule"] == "speech-llm packed estimate"
    budget = sized["batch_size_source"]["budget_bytes"]
    fewest = min(b["oom_sequences"] for b in sized["buckets"])
    assert fewest >= 1 and f"plan-batches --pack 4096 --sequences-per-batch {fewest}" in res.output
    for b in sized["buckets"]:
        s, share = b["oom_sequences"], b["oom_audio_share"]
        assert packed_memory(QWEN, 4096, s, share)["peak"] <= budget < packed_memory(QWEN, 4096, s + 1, share)["peak"]
        members = 4096 // (-(-int(b["max_duration"] * 125) // 10) + b["max_tokens"])
        assert b["batch_size"] == s * max(1, members)
    # full fine-tuning of the same model holds fewer sequences
    res = runner.invoke(app, ["oomptimize", str(buckets), "--model", "canary-qwen-2.5b", "--pack", "4096", "--estimate",
                              "--gpu-memory", "80GiB", "-o", str(out), "--lora-rank", "0"])
    assert res.exit_code == 0, res.output
    assert sum(b["oom_sequences"] for b in json.loads(out.read_text())["buckets"]) < sum(
        b["oom_sequences"] for b in sized["buckets"])


@pytest.mark.parametrize("args,message", [
    (["--model", "canary-qwen-2.5b", "--pack", "4096"], "--pack: packed batches are sized by the shape estimate"),
    (["--model", "tiny", "--pack", "4096", "--estimate", "--gpu-memory", "8GiB"], "--model: 'tiny': not a speech-LLM"),
    (["--model", "canary-qwen-2.5b", "--pack", "0", "--estimate", "--gpu-memory", "8GiB"], "--pack: must be >= 1"),
    (["--model", "canary-qwen-2.5b", "--pack", "64", "--estimate", "--gpu-memory", "8GiB", "--lora-rank", "-1"],
     "--lora-rank: must be >= 0"),
    (["--model", "tiny", "--estimate", "--gpu-memory", "8GiB", "--lora-rank", "4"], "--lora-rank: only matters with --pack"),
    (["--model", "canary-qwen-2.5b", "--pack", "64", "--estimate", "--gpu-memory", "8GiB", "--cost-equal"],
     "--cost-equal: not available with --pack"),
    (["--model", "canary-qwen-2.5b", "--pack", "65536", "--estimate", "--gpu-memory", "8GiB"],
     "bucket 0 (max 4 s, 40 tokens): no sequence of 65536 tokens fits the budget"),
])
def test_cli_refusals(buckets: Path, tmp_path: Path, args: list[str], message: str) -> None:
    res = runner.invoke(app, ["oomptimize", str(buckets), *args, "-o", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "o.json").exists()
