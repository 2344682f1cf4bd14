"""``channel_selector: FIELD`` as NeMo 3.0's Lhotse loader reads it: each cut keeps the channel
its ``custom[FIELD]`` names (NeMo's ``_select_channel``), on real stereo audio through a plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.errors import DataprepError
from tests.training._consumer import invoke

pytest.importorskip("lhotse")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def stereo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(manifest, plan): 8 stereo files, each row naming its channel in a ``mic`` field."""
    root = tmp_path_factory.mktemp("stereo")
    rows = []
    for i in range(8):
        path = write_tone(root / f"s{i}.wav", 0.5 + 0.1 * i, sample_rate=16000, channels=2, seed=i)
        rows.append({"audio_filepath": str(path), "duration": 0.5 + 0.1 * i, "text": f"word {i}", "mic": i % 2})
    source = write_nemo_manifest(root / "source.jsonl", rows)
    manifest, buckets, plan = root / "m.parquet", root / "b.json", root / "plan"
    spm = root / "spm.model"
    train_model([" ".join(WORDS)] * 4, spm, vocab_size=40, threads=1)
    invoke("compile", str(source), "--tokenizer", str(spm), "-o", str(manifest), "--probe", "always")
    invoke("fit-buckets", str(manifest), "-o", str(buckets), "--num-buckets", "2", "--num-subbuckets", "1")
    invoke("plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", "1", "-o", str(plan))
    return manifest, plan


class _Cuts(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A NeMo-style dataset that returns the step's cuts as they are."""

    def __getitem__(self, cuts: Any) -> Any:
        return cuts


def _cuts(manifest: Path, plan: Path, selector: Any) -> list[Any]:
    from dataprep.integrations.nemo import get_plan_dataloader

    config = {"plan_dir": str(plan), "manifest": str(manifest), "channel_selector": selector}
    loader = get_plan_dataloader(config, global_rank=0, world_size=1, dataset=_Cuts())
    return [c for batch in loader for c in batch]


def test_each_cut_keeps_the_channel_its_field_names(stereo: tuple[Path, Path]) -> None:
    cuts = _cuts(*stereo, "mic")
    assert len(cuts) == 8
    for cut, every in zip(cuts, _cuts(*stereo, None)):  # plan order both times
        assert cut.num_channels == 1
        mic = cut.custom["mic"]
        both = every.load_audio()
        assert both.shape[0] == 2
        np.testing.assert_array_equal(cut.load_audio()[0], both[mic])


def test_a_missing_field_is_one_line(stereo: tuple[Path, Path]) -> None:
    with pytest.raises(DataprepError, match=r"channel_selector: cut \S+ has no field 'room'"):
        _cuts(*stereo, "room")


@pytest.mark.nemo
def test_the_channels_are_nemos(stereo: tuple[Path, Path]) -> None:
    """NeMo's own ``_select_channel`` on the plan's every-channel cuts gives the same audio."""
    pytest.importorskip("nemo.collections.common.data.lhotse.dataloader", reason="NeMo is not installed (make test-nemo)")
    from nemo.collections.common.data.lhotse.dataloader import _select_channel

    for cut, ours in zip(_cuts(*stereo, None), _cuts(*stereo, "mic")):
        theirs = _select_channel(cut, "mic")
        assert theirs.id == ours.id
        np.testing.assert_array_equal(theirs.load_audio(), ours.load_audio())
