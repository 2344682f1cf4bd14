"""Text corpora read as NeMo's own adapters read them (``txt``, ``txt_pair``, ``nemo_sft_jsonl``,
``multimodal_conversation``): the same examples, answers and contexts, on real transcripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifests.readers._text import iter_conversations, iter_nemo_sft, iter_txt, iter_txt_pair
from tests.conftest import needs_module, read_shared_csv

pytestmark = [pytest.mark.nemo,
              needs_module("nemo.collections.common.data.lhotse.text_adapters", "nemo_toolkit is not installed (make test-nemo)")]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return read_shared_csv("commonvoice.id_ps.csv")["text"].drop_nulls().to_list()[:200]


def _rows(frames: object) -> list[dict[str, object]]:
    return [r for f in frames for r in f.iter_rows(named=True)]  # type: ignore[attr-defined]


def test_txt_and_pairs_as_nemo(tmp_path: Path, texts: list[str]) -> None:
    from nemo.collections.common.data.lhotse.text_adapters import LhotseTextAdapter, LhotseTextPairAdapter

    (tmp_path / "a.txt").write_text("\n".join(texts[:80]) + "\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(t.upper() for t in texts[:80]) + "\n", encoding="utf-8")
    ours = _rows(iter_txt([str(tmp_path / "a.txt")], "id", 1000))
    nemo = list(LhotseTextAdapter(paths=str(tmp_path / "a.txt"), language="id"))
    assert [r["text"] for r in ours] == [ex.text.strip() for ex in nemo]
    pairs = _rows(iter_txt_pair([str(tmp_path / "a.txt")], [str(tmp_path / "b.txt")], "id", "id", 7))  # small chunks
    nemo_pairs = list(LhotseTextPairAdapter(source_paths=str(tmp_path / "a.txt"), target_paths=str(tmp_path / "b.txt")))
    assert [(json.loads(r["extra"])["context"], r["text"]) for r in pairs] == \
        [(ex.source.text, ex.target.text) for ex in nemo_pairs]


def test_sft_and_conversations_as_nemo(tmp_path: Path, texts: list[str]) -> None:
    from nemo.collections.common.data.lhotse.text_adapters import NeMoMultimodalConversationJsonlAdapter, NeMoSFTJsonlAdapter

    with (tmp_path / "sft.jsonl").open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts[:50]):
            turns = [{"from": "User", "value": f"Q{i}: {t.lower()}"}, {"from": "Assistant", "value": t},
                     {"from": "User", "value": "again"}, {"from": "Assistant", "value": t.upper()}]
            f.write(json.dumps({"conversations": turns, "mask": "User"}) + "\n")
    ours = _rows(iter_nemo_sft([str(tmp_path / "sft.jsonl")], None, 1000))
    nemo = list(NeMoSFTJsonlAdapter(paths=str(tmp_path / "sft.jsonl")))
    assert len(ours) == len(nemo) == 50
    for row, ex in zip(ours, nemo):
        turns = ex.data["conversations"]
        assert json.loads(str(row["extra"]))["context"] == " ".join(t["value"] for t in turns if t["from"] == "User")
        assert row["text"] == " ".join(t["value"] for t in turns if t["from"] != "User")
    with (tmp_path / "conv.jsonl").open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts[50:90]):
            turns = [{"from": "User", "type": "text", "value": f"say {t.lower()}"},
                     {"from": "Assistant", "type": "text", "value": t}]
            f.write(json.dumps({"id": f"c{i}", "conversations": turns}) + "\n")
    ours = _rows(iter_conversations([str(tmp_path / "conv.jsonl")], None, {"system_prompt": "Be brief."}, 1000))
    nemo = list(NeMoMultimodalConversationJsonlAdapter(manifest_filepath=str(tmp_path / "conv.jsonl"),
                                                       audio_locator_tag="<|audio|>", system_prompt="Be brief."))
    assert [r["id"] for r in ours] == [c.id for c in nemo]
    for row, conv in zip(ours, nemo):  # NeMo prepends the system prompt as a turn
        assert json.loads(str(row["extra"]))["context"] == " ".join(t.value for t in conv.turns if t.role != "assistant")
        assert row["text"] == " ".join(t.value for t in conv.turns if t.role == "assistant")
