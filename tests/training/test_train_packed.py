"""A packed plan end to end: ``plan-batches --pack N`` on real audio, its shards read into packed
batches whose bounds match the plan's, the tiny speech-LLM trained on it by ``dataprep train``
(loss falls, resume continues at exactly the step), and the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dataprep.cli import app
from dataprep.training.features import FeatureConfig
from dataprep.training.packed import PackedBatchBuilder
from manifests.plan_files import PlanShard
from oom.packed_estimate import SPEECH_LLMS
from tests.training._consumer import Corpus, invoke, runner, shared_corpus
from tests.training.test_train_ddp import read_jsonl, train_args


def packed_args(c: Corpus, manifest: Path, plan: Path, ckpt: Path, *extra: str) -> list[str]:
    """``dataprep train`` arguments of :func:`train_args` with another manifest."""
    return [str(manifest) if a == str(c.manifest) else a for a in train_args(c, plan, ckpt, *extra)]

TINY = SPEECH_LLMS["tiny-speech-llm"]
PACK = "128"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Corpus, Path, Path]:
    """(corpus, manifest compiled with --prompt-tokens 2 (the model's [bos] + [eos]), its packed plan)."""
    c = shared_corpus(tmp_path_factory)
    root = tmp_path_factory.mktemp("packed")
    manifest, buckets, plan = root / "m2.parquet", root / "b2.json", root / "plan"
    invoke("compile", str(c.source), "--tokenizer", str(c.spm), "--prompt-tokens", "2", "-o", str(manifest),
           "--probe", "never")
    invoke("fit-buckets", str(manifest), "-o", str(buckets), "--num-buckets", "3", "--num-subbuckets", "2",
           "--max-duration-budget", "8")
    invoke("plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", "1", "--pack", PACK,
           "-o", str(plan))
    return c, manifest, plan


def test_packed_plan_batches_match_the_plan(packed: tuple[Corpus, Path, Path], tmp_path: Path) -> None:
    c, manifest, plan = packed
    builder = PackedBatchBuilder(manifest, [str(c.spm)], features=FeatureConfig.ours(TINY.n_mels),
                                 cache_dir=tmp_path, subsampling=TINY.subsampling, check_rate=True, plan=str(plan))
    several = 0
    for pb in PlanShard(plan, 0):
        b = builder.build(pb)  # checks the real bounds against the shard's cu_seqlens
        assert b.ids == pb.ids and b.sequence.tolist() == pb.sequence.tolist()
        real = np.diff(b.cu_seqlens.numpy())
        assert real.max() <= int(PACK) + np.bincount(pb.sequence).max()  # N, give or take audio rounding
        assert abs(real - np.diff(pb.cu_seqlens)).max() <= np.bincount(pb.sequence).max()
        several += b.num_sequences > 1 or len(pb.ids) > b.num_sequences
    assert several  # some batch holds several members in one sequence or several sequences


def test_train_on_a_packed_plan_and_resume_at_the_step(packed: tuple[Corpus, Path, Path], tmp_path: Path) -> None:
    c, manifest, plan = packed
    args = ["--model", "tiny-speech-llm", "--trace", "--lr", "0.003"]

    def train(ckpt: Path, *extra: str) -> None:
        invoke(*packed_args(c, manifest, plan, ckpt, *args, *extra))

    whole, part = tmp_path / "whole", tmp_path / "part"
    train(whole, "--steps", "8")
    train(part, "--steps", "4")
    train(part, "--steps", "8", "--resume")
    log_whole, log_part = read_jsonl(whole / "log.jsonl"), read_jsonl(part / "log.jsonl")
    assert [x["step"] for x in log_part] == list(range(8))
    assert log_whole[-1]["loss"] < log_whole[0]["loss"]
    assert [x["loss"] for x in log_part] == [x["loss"] for x in log_whole]  # resumed exactly
    assert read_jsonl(part / "trace-rank-00000.jsonl") == read_jsonl(whole / "trace-rank-00000.jsonl")


def test_packed_plan_refuses_a_mismatched_model_or_manifest(packed: tuple[Corpus, Path, Path], tmp_path: Path) -> None:
    c, manifest, plan = packed
    res = runner.invoke(app, packed_args(c, manifest, plan, tmp_path / "a", "--model", "tiny"))
    assert res.exit_code == 2 and "a packed plan (--pack 128) trains a speech-LLM: --model tiny-speech-llm" in res.output
    # the corpus compiled without --prompt-tokens 2: the plan's token-equivalents are not the model's
    other = tmp_path / "plan0"
    invoke("plan-batches", str(c.manifest), "--buckets", str(c.buckets), "--world-size", "1", "--pack", PACK,
           "-o", str(other))
    res = runner.invoke(app, train_args(c, other, tmp_path / "b", "--model", "tiny-speech-llm"))
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith(f"error: {other}: step 0: sequence 0:") and "compile with --prompt-tokens 2" in line


def test_unpacked_plan_trains_one_utterance_a_sequence(packed: tuple[Corpus, Path, Path], tmp_path: Path) -> None:
    c, _, _ = packed
    invoke(*train_args(c, c.plan(1), tmp_path / "u", "--model", "tiny-speech-llm", "--steps", "2"))
    assert [x["step"] for x in read_jsonl(tmp_path / "u" / "log.jsonl")] == [0, 1]


def test_samplers_replay_the_packed_sequences(packed: tuple[Corpus, Path, Path], tmp_path: Path) -> None:
    """PlanBatchSampler(with_sequences=True) pairs each row with its sequence; Lhotse's PlanSampler
    puts it on each cut, and PackedCuts turns the step's cuts into the packed batch our loader
    builds (the same samples with ``resampler="lhotse"``)."""
    pytest.importorskip("lhotse")
    from dataprep.integrations.lhotse import PlanSampler
    from dataprep.integrations.torch import PlanBatchSampler
    from dataprep.training.packed import PackedCuts

    c, manifest, plan = packed
    shard = list(PlanShard(plan, 0))
    pairs = list(PlanBatchSampler(plan, 0, with_sequences=True))
    assert pairs == [list(zip(pb.rows.tolist(), pb.sequence.tolist())) for pb in shard]
    assert list(PlanBatchSampler(plan, 0)) == [pb.rows.tolist() for pb in shard]
    builder = PackedBatchBuilder(manifest, [str(c.spm)], features=FeatureConfig.ours(TINY.n_mels), cache_dir=tmp_path,
                                 subsampling=TINY.subsampling, resampler="lhotse")
    dataset = PackedCuts([str(c.spm)], TINY.subsampling, FeatureConfig.ours(TINY.n_mels))
    sampler = PlanSampler(plan, manifest, rank=0, world_size=1, cache_dir=tmp_path)
    for pb, cuts in zip(shard[:6], sampler):
        assert [cut.custom["plan_sequence"] for cut in cuts] == pb.sequence.tolist()
        ours, theirs = builder.build(pb), dataset[cuts]
        assert theirs.ids == ours.ids and theirs.step == pb.step
        for name in ("input_ids", "labels", "position_ids", "audio_mask", "cu_seqlens", "member_cu_seqlens",
                     "feature_lens"):
            assert torch.equal(getattr(theirs, name), getattr(ours, name)), name
        torch.testing.assert_close(theirs.features, ours.features, rtol=1e-4, atol=1e-4)


def test_text_only_rows_of_a_blend_pack_without_audio(packed: tuple[Corpus, Path, Path], tmp_path: Path) -> None:
    """Rows of duration 0 (text-only) read no audio, add no audio token, match the plan's
    token-equivalents, and train."""
    import polars as pl

    from manifests.manifest_write import write_manifest

    c, manifest, _ = packed
    speech = pl.read_parquet(manifest)
    text = speech.head(10).with_columns(pl.format("text-{}", pl.col("id")).alias("id"), pl.lit(0.0).alias("duration"),
                                        pl.lit(0.0).alias("tps"))
    blend, plan = tmp_path / "blend.parquet", tmp_path / "plan"
    write_manifest(pl.concat([speech, text], how="vertical_relaxed"), blend)
    invoke("plan-batches", str(blend), "--buckets", str(manifest.parent / "b2.json"), "--world-size", "1", "--pack", PACK,
           "-o", str(plan))
    builder = PackedBatchBuilder(blend, [str(c.spm)], features=FeatureConfig.ours(TINY.n_mels), cache_dir=tmp_path,
                                 subsampling=TINY.subsampling, check_rate=True, plan=str(plan))
    seen = 0
    for pb in PlanShard(plan, 0):
        b = builder.build(pb)  # real bounds checked against the plan's
        text_only = np.array([i.startswith("text-") for i in b.ids], dtype=bool)
        assert (b.audio_tokens.numpy()[text_only] == 0).all() and (b.audio_tokens.numpy()[~text_only] > 0).all()
        seen += int(text_only.sum())
    assert seen == 10
    invoke(*packed_args(c, blend, plan, tmp_path / "ck", "--model", "tiny-speech-llm"))
    pytest.importorskip("lhotse")
    from dataprep.integrations.lhotse import PlanSampler
    from dataprep.training.packed import PackedCuts

    dataset = PackedCuts([str(c.spm)], TINY.subsampling, FeatureConfig.ours(TINY.n_mels))
    lhotse_builder = PackedBatchBuilder(blend, [str(c.spm)], features=FeatureConfig.ours(TINY.n_mels),
                                        cache_dir=tmp_path, subsampling=TINY.subsampling, resampler="lhotse")
    for pb, cuts in zip(PlanShard(plan, 0), PlanSampler(plan, blend, rank=0, world_size=1, cache_dir=tmp_path)):
        theirs, ours = dataset[cuts], lhotse_builder.build(pb)
        assert torch.equal(theirs.input_ids, ours.input_ids) and torch.equal(theirs.cu_seqlens, ours.cu_seqlens)
