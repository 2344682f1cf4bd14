"""Text-only corpora in an ``input_cfg`` blend (``txt``, ``txt_jsonl``, ``txt_pair``,
``nemo_sft_jsonl``) with a speech corpus, from compile through stats, filter, fit-buckets and
plan-batches, on real LibriSpeech transcripts, as a user runs the commands."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import sentencepiece as spm
import yaml
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.manifest_read import read_manifest, read_metadata
from tests.conftest import read_shared_csv

runner = CliRunner()


def _run(*args: object) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A blend of 12 utterances of real audio and four text corpora from LibriSpeech dev-clean
    transcripts, with bad lines of each kind."""
    root = tmp_path_factory.mktemp("textblend")
    texts = read_shared_csv("librispeech.dev-clean.csv")["text"].to_list()
    rows = []
    for i in range(12):
        path = write_tone(root / "audio" / f"u{i}.flac", 1.0 + 0.25 * i, sample_rate=16000, seed=i)
        rows.append({"audio_filepath": str(path.relative_to(root)), "text": texts[i].lower(), "lang": "en"})
    write_nemo_manifest(root / "speech.json", rows)
    (root / "lm.txt").write_text("\n".join(texts[100:140]) + "\n\n", encoding="utf-8")  # a blank line: no row
    (root / "lm2.txt").write_bytes(b"\n".join(t.encode() for t in texts[140:150]) + b"\nbad \xff byte\n")
    (root / "src.txt").write_text("\n".join(t.lower() for t in texts[200:230]) + "\n", encoding="utf-8")
    (root / "tgt.txt").write_text("\n".join(texts[200:229]) + "\n", encoding="utf-8")  # one line short
    with (root / "sft.jsonl").open("w", encoding="utf-8") as f:
        for t in texts[300:320]:
            f.write(json.dumps({"system": "Answer in capitals.", "dataset": "ls", "conversations": [
                {"from": "User", "value": f"Repeat: {t.lower()}"}, {"from": "Assistant", "value": t}]}) + "\n")
        f.write('{"conversations": [{"from": "User"}]}\n{"dataset": "ls"}\n{not json\n')
    with (root / "docs.jsonl").open("w", encoding="utf-8") as f:
        for t in texts[400:410]:
            f.write(json.dumps({"body": t, "source": "ls"}) + "\n")
        f.write(json.dumps({"body": 3}) + "\n")
    train_model(texts[:2000], root / "spm.model", vocab_size=256, threads=1)
    cfg = {"input_cfg": [
        {"type": "nemo", "manifest_filepath": "speech.json", "weight": 3.0},
        {"type": "group", "weight": 1.0, "tags": {"taskname": "lm"}, "input_cfg": [
            {"type": "txt", "paths": ["lm.txt", "lm2.txt"], "language": "en", "weight": 1.0},
            {"type": "txt_jsonl", "paths": "docs.jsonl", "text_field": "body", "language": "en", "weight": 1.0},
        ]},
        {"type": "txt_pair", "source_paths": "src.txt", "target_paths": "tgt.txt", "source_language": "en",
         "target_language": "en", "weight": 1.0},
        {"type": "nemo_sft_jsonl", "paths": "sft.jsonl", "language": "en", "weight": 1.0},
    ]}
    (root / "blend.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    _run("compile", root / "blend.yaml", "--tokenizer", root / "spm.model", "--prompt-tokens", 2,
         "-o", root / "m.parquet", "--rejects", root / "r.parquet")
    return root


def test_compile_text_rows(blend: Path) -> None:
    m, r = read_manifest(blend / "m.parquet"), pl.read_parquet(blend / "r.parquet")
    lines = 12 + 40 + 11 + 11 + 30 + 23  # rows in: every non-blank line (a pair's: its source's or target's)
    assert m.height + r.height == lines
    assert read_metadata(blend / "m.parquet")["schema_version"] == 4 and m.columns[-2:] == ["corpus", "modality"]
    text, audio = m.filter(pl.col("modality") == "text"), m.filter(pl.col("modality") == "audio")
    assert audio.height == 12 and audio["audio_path"].null_count() == 0 and audio["tps"].null_count() == 0
    assert text["audio_path"].null_count() == text.height and (text["duration"] == 0.0).all()
    assert text["tps"].null_count() == text.height
    assert dict(text.group_by("corpus").len().iter_rows()) == {"lm": 50, "docs": 10, "src": 29, "sft": 20}
    assert set(text.filter(pl.col("corpus") == "lm")["task"]) == {"lm"}  # the group's tag
    # tokens: context (a pair's source, a conversation's system + user turns) + answer + the prompt's 2
    sp = spm.SentencePieceProcessor(model_file=str(blend / "spm.model"))
    pair = text.filter(pl.col("id") == "src.txt:1").row(0, named=True)
    src = (blend / "src.txt").read_text(encoding="utf-8").splitlines()[0]
    assert pair["text"] == (blend / "tgt.txt").read_text(encoding="utf-8").splitlines()[0]
    assert pair["num_tokens"] == len(sp.encode(src)) + len(sp.encode(pair["text"])) + 2
    sft = text.filter(pl.col("id") == "sft.jsonl:1").row(0, named=True)
    extra = json.loads(sft["extra"])
    assert extra["context"].startswith("Answer in capitals. Repeat: ") and len(extra["conversations"]) == 2
    assert sft["num_tokens"] == len(sp.encode(extra["context"])) + len(sp.encode(sft["text"])) + 2
    assert json.loads(text.filter(pl.col("id") == "docs.jsonl:1")["extra"][0]) == {"source": "ls"}
    reasons = {d.split(": ", 1)[0].rsplit("/", 1)[-1]: reason for reason, d in r.select("reason", "detail").iter_rows()}
    assert reasons == {"lm2.txt:11": "non_utf8", "src.txt:30": "missing_field", "sft.jsonl:21": "malformed_line",
                       "sft.jsonl:22": "missing_field", "sft.jsonl:23": "malformed_line",
                       "docs.jsonl:11": "malformed_line"}
    assert (r["modality"] == "text").all()


def test_audio_only_blend_has_no_modality_column(blend: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump([{"type": "nemo", "manifest_filepath": str(blend / "speech.json")}]), encoding="utf-8")
    _run("compile", cfg, "--tokenizer", blend / "spm.model", "-o", tmp_path / "a.parquet")
    assert "modality" not in read_manifest(tmp_path / "a.parquet").columns
    assert read_metadata(tmp_path / "a.parquet")["schema_version"] == 3


def test_stats_per_modality_and_token_equivalents(blend: Path, tmp_path: Path) -> None:
    out = _run("stats", blend / "m.parquet", "--audio-token-rate", 12.5, "--json", tmp_path / "s.json")
    assert "Per modality" in out and "Token-equivalents" in out
    s = json.loads((tmp_path / "s.json").read_text())
    m = read_manifest(blend / "m.parquet")
    assert {k: v["utterances"] for k, v in s["modalities"].items()} == {"audio": 12, "text": 109}
    audio = m.filter(pl.col("modality") == "audio")
    assert s["quantiles"]["duration"]["p0"] == audio["duration"].min()  # text rows are no 0 s audio
    assert sum(b["count"] for b in s["tps_by_duration"]) == 12
    te = s["token_equivalents"]
    import math
    want_audio = sum(math.ceil(d / 0.08) + t for d, t in audio.select("duration", "num_tokens").iter_rows())
    want_text = int(m.filter(pl.col("modality") == "text")["num_tokens"].sum())
    assert (te["audio"], te["text"], te["total"]) == (want_audio, want_text, want_audio + want_text)
    assert "token_equivalents" not in json.loads((Path(_json(blend, tmp_path))).read_text())


def _json(blend: Path, tmp_path: Path) -> Path:
    _run("stats", blend / "m.parquet", "--json", tmp_path / "plain.json")
    return tmp_path / "plain.json"


def test_filter_text_rows_pass_tps_and_duration(blend: Path, tmp_path: Path) -> None:
    out = tmp_path / "k.parquet"
    _run("filter", blend / "m.parquet", "--max-tps", 12, "--min-duration", 1.5, "--max-tokens", 60, "-o", out)
    k, r = read_manifest(out), pl.read_parquet(tmp_path / "k.rejects.parquet")
    m = read_manifest(blend / "m.parquet")
    assert k.height + r.height == m.height
    text = m.filter(pl.col("modality") == "text")
    assert set(r.filter(pl.col("modality") == "text")["reason"]) == {"max_tokens"}
    assert k.filter(pl.col("modality") == "text").height == text.filter(pl.col("num_tokens") <= 60).height
    assert k.columns == m.columns and (k["modality"].is_not_null()).all()


def test_fit_and_plan_with_text_rows(blend: Path, tmp_path: Path) -> None:
    kept, buckets, plan = tmp_path / "k.parquet", tmp_path / "b.json", tmp_path / "plan"
    _run("filter", blend / "m.parquet", "--max-tps", 1000, "-o", kept)  # every row kept; no blend weights recorded
    _run("fit-buckets", kept, "--num-buckets", 3, "--num-subbuckets", 2, "--max-duration-budget", 30, "-o", buckets)
    spec = json.loads(buckets.read_text())
    _run("plan-batches", kept, "--buckets", buckets, "--world-size", 2, "--epochs", 2, "--audio-token-rate", 12.5,
         "-o", plan)
    m = read_manifest(kept)
    assert m.height == read_manifest(blend / "m.parquet").height
    meta = json.loads((plan / "plan.json").read_text())
    assert meta["audio_token_rate"] == 12.5
    shards = [pl.read_parquet(p) for p in sorted(plan.glob("rank-*.parquet"))]
    first_bin = spec["buckets"][0]["max_duration"]
    bound = max(b["max_tokens"] for b in spec["buckets"] if b["max_duration"] == first_bin)
    text = m.with_row_index().filter(pl.col("modality") == "text")
    text_rows = set(text.filter(pl.col("num_tokens") <= bound)["index"].to_list())
    assert len(text_rows) > text.height // 2
    for epoch in (0, 1):
        rows = [r for s in shards for b in s.filter(pl.col("epoch") == epoch)["rows"].to_list() for r in b]
        assert sorted(rows) == list(range(m.height))  # every row once per epoch, text rows included
    in_first = {r for s in shards for bucket, rows in s.select("bucket", "rows").iter_rows()
                if spec["buckets"][bucket]["max_duration"] == first_bin for r in rows}
    assert text_rows <= in_first  # text rows (duration 0) in the shortest duration bin that holds their tokens
    # the weighted blend plans too (each corpus its quota)
    _run("plan-batches", blend / "m.parquet", "--buckets", buckets, "--world-size", 2, "-o", tmp_path / "weighted")


def test_plan_sized_by_nemo_batch_tokens(blend: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"train_ds": {
        "use_multimodal_sampling": True, "token_equivalent_duration": 0.08, "batch_tokens": 3000,
        "quadratic_factor": 2000, "bucket_duration_bins": [[30, 120], [50, 200], [80, 200]]}}}), encoding="utf-8")
    _run("plan-batches", blend / "m.parquet", "--buckets", cfg, "--world-size", 1, "-o", tmp_path / "plan")
    meta = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert meta["audio_token_rate"] == 12.5
    from bucketing.token_equivalents import token_batch_sizes

    assert [b["batch_size"] for b in meta["buckets"]] == token_batch_sizes([150, 250, 280], 3000, 2000).tolist()
    res = runner.invoke(app, ["plan-batches", str(blend / "m.parquet"), "--buckets", str(cfg), "--world-size", "1",
                              "--audio-token-rate", "25", "-o", str(tmp_path / "p2")])
    assert res.exit_code == 2 and "disagrees with" in res.output and "Traceback" not in res.output


def test_parted_compile_same_bytes(blend: Path, tmp_path: Path) -> None:
    """A compile split in parts (a pool of 2 workers over 3 parts) writes the one-process bytes,
    the modality column included."""
    _run("compile", blend / "blend.yaml", "--tokenizer", blend / "spm.model", "--prompt-tokens", 2,
         "--workers", 2, "--num-parts", 3, "-o", tmp_path / "m.parquet", "--rejects", tmp_path / "r.parquet")
    assert (tmp_path / "m.parquet").read_bytes() == (blend / "m.parquet").read_bytes()
    assert (tmp_path / "r.parquet").read_bytes() == (blend / "r.parquet").read_bytes()


def test_pack_refuses_text_rows_in_one_line(blend: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["pack", str(blend / "m.parquet"), "-o", str(tmp_path / "packed")])
    assert res.exit_code == 2 and "109 rows are text-only" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "packed").exists()


def test_multimodal_conversations(blend: Path, tmp_path: Path) -> None:
    """``multimodal_conversation``: one audio turn an audio row (its duration probed where the line
    gives none), none a text row; the tags NeMo prepends as turns count in the context."""
    texts = read_shared_csv("librispeech.dev-clean.csv")["text"].to_list()[500:506]
    audio = [write_tone(tmp_path / "conv" / f"c{i}.flac", 1.5 + i, sample_rate=16000, seed=40 + i) for i in range(3)]
    lines = [
        {"id": "a0", "conversations": [{"from": "User", "type": "audio", "value": "conv/c0.flac", "duration": 1.5},
                                       {"from": "Assistant", "type": "text", "value": texts[0]}]},
        {"id": "a1", "conversations": [{"from": "User", "type": "text", "value": "Transcribe:"},
                                       {"from": "User", "type": "audio", "value": "conv/c1.flac"},
                                       {"from": "Assistant", "type": "text", "value": texts[1]}]},
        {"id": "t0", "conversations": [{"from": "User", "type": "text", "value": texts[2].lower()},
                                       {"from": "Assistant", "type": "text", "value": texts[2]}]},
        {"id": "x0", "conversations": [{"from": "User", "type": "audio", "value": "conv/c0.flac", "duration": 1.5},
                                       {"from": "User", "type": "audio", "value": "conv/c2.flac", "duration": 3.5},
                                       {"from": "Assistant", "type": "text", "value": texts[3]}]},
        {"conversations": [{"from": "Assistant", "type": "text", "value": texts[4]}]},
        {"id": "x2", "conversations": [{"from": "User", "type": "audio", "value": "conv/c2.flac", "duration": "long"},
                                       {"from": "Assistant", "type": "text", "value": texts[5]}]},
    ]
    (tmp_path / "conv.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    (tmp_path / "b.yaml").write_text(yaml.safe_dump([{
        "type": "multimodal_conversation", "manifest_filepath": "conv.jsonl", "audio_locator_tag": "<|audio|>",
        "tags": {"system_prompt": "You transcribe.", "context": "Listen:"}}]), encoding="utf-8")
    _run("compile", tmp_path / "b.yaml", "--tokenizer", blend / "spm.model", "-o", tmp_path / "m.parquet")
    m, r = read_manifest(tmp_path / "m.parquet"), pl.read_parquet(tmp_path / "m.rejects.parquet")
    assert m["id"].to_list() == ["a0", "a1", "t0"] and m["modality"].to_list() == ["audio", "audio", "text"]
    assert m["audio_path"].to_list()[:2] == [str(audio[0]), str(audio[1])]
    assert m["duration"].to_list() == pytest.approx([1.5, 2.5, 0.0], abs=1e-3)  # a1's probed from its header
    details = [d.split("conv.jsonl:", 1)[1] for d in r["detail"]]
    assert details == ["4: 2 audio turns: a row holds one (split the conversation)", "5: missing string field 'id'",
                       "6: an audio turn's 'duration' or 'offset' is not a number"]
    assert r["reason"].to_list() == ["malformed_line", "missing_field", "malformed_line"]
    sp = spm.SentencePieceProcessor(model_file=str(blend / "spm.model"))
    ctx = [json.loads(e).get("context") for e in m["extra"]]
    assert ctx == ["You transcribe. Listen:", "You transcribe. Transcribe:", f"You transcribe. {texts[2].lower()}"]
    for row, c in zip(m.iter_rows(named=True), ctx):
        assert row["num_tokens"] == len(sp.encode(c)) + len(sp.encode(row["text"]))
    assert "system_prompt" not in m["extra"][0]  # the tags NeMo turns into turns are in the context, not fields
