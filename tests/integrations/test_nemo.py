"""NeMo (Canary) on a plan: NeMo's own prompt formatter, dataset and manifest reader against ours.

Marked ``nemo``; skipped (with the reason) where ``nemo_toolkit`` is not installed. ``make
test-nemo`` installs ``nemo-toolkit[asr]`` and runs them. Real audio: tones, segments, stereo
files and ../shared/data/audio; a real CanaryTokenizer (NeMo's aggregate of a special-token
model and our sentencepiece model per language).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lhotse import CutSet

from manifests.manifest_read import read_manifest
from manifests.plan_files import open_shard
from tests.conftest import needs_module
from tests.integrations._nemo import canary_tokenizer
from tests.integrations._rich import Rich, rich_corpus

pytestmark = [pytest.mark.nemo,
              needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer(rich: Rich, tmp_path_factory: pytest.TempPathFactory) -> Any:
    langs = {x for c in ("source_lang", "target_lang", "lang") for x in read_manifest(rich.manifest)[c].drop_nulls()}
    return canary_tokenizer(rich.spm, langs, tmp_path_factory.mktemp("spl"))


def plan_ids(plan: Path, rank: int) -> list[list[str]]:
    return [b.ids for b in open_shard(plan, rank)]


@pytest.mark.parametrize("fmt", ["canary2", "canary"])
def test_nemo_counts_our_tokens(rich: Rich, tokenizer: Any, tmp_path: Path, fmt: str) -> None:
    """For every cut of a real-audio manifest, NeMo's ``len(input_ids)`` (what its buckets and
    TPS filter measure) equals our ``num_tokens`` from ``compile --prompt-format``."""
    from nemo.collections.common.data.lhotse.dataloader import tokenize_with_prompt

    from dataprep.integrations.cuts import cuts_for_rows
    from tests.training._consumer import invoke

    manifest = rich.manifest
    if fmt != "canary2":
        manifest = tmp_path / f"{fmt}.parquet"
        invoke("compile", str(rich.source), "--tokenizer", str(rich.spm), "-o", str(manifest), "--probe", "always",
               "--prompt-format", fmt)
    df = read_manifest(manifest)
    cuts = cuts_for_rows(df.to_arrow(), channel=0)
    for cut, ours in zip(cuts, df["num_tokens"]):
        cut = tokenize_with_prompt(cut, tokenizer, fmt)
        assert len(cut.input_ids) == ours, cut.id


def _loader(rich: Rich, tokenizer: Any, rank: int, workers: int, iterable: bool = False) -> Any:
    from nemo.collections.asr.data.audio_to_text_lhotse_prompted import PromptedAudioToTextLhotseDataset
    from nemo.collections.common.prompts import Canary2PromptFormatter

    from dataprep.integrations.nemo import get_plan_dataloader

    config = {"use_lhotse": True, "plan_dir": str(rich.plan), "manifest": str(rich.manifest), "sample_rate": 16000,
              "channel_selector": 0, "num_workers": workers, "force_iterable_dataset": iterable}
    dataset = PromptedAudioToTextLhotseDataset(tokenizer=tokenizer, prompt=Canary2PromptFormatter(tokenizer))
    return get_plan_dataloader(config, global_rank=rank, world_size=2, dataset=dataset, tokenizer=tokenizer)


@pytest.mark.parametrize(("workers", "iterable"), [(0, False), (2, False), (2, True)])
def test_canary2_dataset_over_get_plan_dataloader_yields_the_plan(rich: Rich, tokenizer: Any, workers: int,
                                                                  iterable: bool) -> None:
    tokens = dict(zip(read_manifest(rich.manifest)["id"], read_manifest(rich.manifest)["num_tokens"]))
    for rank in range(2):
        got = []
        for batch in _loader(rich, tokenizer, rank, workers, iterable):
            ids = [c.id for c in batch.cuts]
            got.append(ids)
            assert batch.audio.shape[0] == len(ids) and batch.audio.dim() == 2  # mono, 16 kHz
            assert batch.prompted_transcript_lens.tolist() == [tokens[i] for i in ids]
        assert got == plan_ids(rich.plan, rank)


def test_resume_through_the_dataloader_state(rich: Rich, tokenizer: Any) -> None:
    full = [[c.id for c in b.cuts] for b in _loader(rich, tokenizer, 1, 2)]
    first = _loader(rich, tokenizer, 1, 2)
    head = []
    for b in first:
        head.append([c.id for c in b.cuts])
        if len(head) == 3:
            break
    state = first.state_dict()
    second = _loader(rich, tokenizer, 1, 2)
    second.load_state_dict(state)
    assert head + [[c.id for c in b.cuts] for b in second] == full == plan_ids(rich.plan, 1)


def test_nemo_reads_our_export_and_keeps_every_row(rich: Rich, tokenizer: Any, tmp_path: Path) -> None:
    """NeMo's own JSONL reader + its canary2 token count + its TPS filter with our ``max_tps``
    keep every exported row; its cut durations and token counts are ours."""
    from nemo.collections.common.data.lhotse.dataloader import _select_channel, tokenize_with_prompt
    from nemo.collections.common.data.lhotse.nemo_adapters import LazyNeMoIterator
    from nemo.collections.common.data.lhotse.sampling import TokenPerSecondFilter

    from dataprep.integrations.export import export_nemo

    cfg = export_nemo(rich.plan, rich.manifest, tmp_path / "nemo")
    cuts = CutSet(LazyNeMoIterator(str(tmp_path / "nemo" / "manifest.jsonl"))).to_eager()
    df = read_manifest(rich.manifest)
    assert len(cuts) == df.height
    keep = TokenPerSecondFilter(-1, cfg["max_tps"])
    kept = 0
    for cut, row in zip(cuts, df.iter_rows(named=True)):
        cut = _select_channel(cut, cfg["channel_selector"])
        cut = tokenize_with_prompt(cut, tokenizer, "canary2")
        assert len(cut.input_ids) == row["num_tokens"]
        assert abs(cut.duration - row["duration"]) < 1e-3
        kept += keep(cut)
    assert kept == df.height
