"""``compile input_cfg.yaml``: NeMo blends of many corpora read with our readers, on real audio."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.errors import ManifestError
from manifests.manifest_read import read_manifest, read_metadata
from manifests.readers import read_blend

runner = CliRunner()


def _nemo(root: Path, name: str, n: int, lang: str, **extra: object) -> Path:
    rows = []
    for i in range(n):
        path = write_tone(root / name / f"{name}{i}.flac", 0.5 + 0.1 * (i % 5), sample_rate=16000, seed=i)
        rows.append({"audio_filepath": str(path.relative_to(root)), "text": " ".join(WORDS[i % 7:i % 7 + 3]),
                     **({"lang": lang} if lang else {}), **extra})
    return write_nemo_manifest(root / f"{name}.json", rows)


def _shar(root: Path, n: int) -> Path:
    lhotse = pytest.importorskip("lhotse")
    cuts = []
    for i in range(n):
        t = write_tone(root / "sharsrc" / f"s{i}.flac", 0.6 + 0.05 * i, sample_rate=16000, seed=100 + i)
        rec = lhotse.Recording.from_file(t, recording_id=f"rec{i}")
        sup = lhotse.SupervisionSegment(id=f"s{i}", recording_id=f"rec{i}", start=0, duration=rec.duration,
                                        text=" ".join(WORDS[i % 5:i % 5 + 2]), language="de")
        cuts.append(lhotse.MonoCut(id=f"cut{i}", start=0, duration=rec.duration, channel=0, recording=rec,
                                   supervisions=[sup]))
    shar = root / "shar"
    shar.mkdir()
    lhotse.CutSet.from_cuts(cuts).to_shar(shar, fields={"recording": "flac"}, shard_size=4)
    return shar


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("blend")
    _nemo(root, "ls_en", 12, "en")
    _nemo(root, "mls_fr", 5, "", pnc="yes")
    _shar(root, 7)
    train_model([" ".join(WORDS)] * 4, root / "spm.model", vocab_size=60, threads=1)
    cfg = {"reweight_temperature": 0.5, "input_cfg": [
        {"type": "group", "weight": 0.7, "tags": {"taskname": "asr"}, "input_cfg": [
            {"type": "nemo", "manifest_filepath": "ls_en.json", "weight": 100.0, "tags": {"corpus": "librispeech"}},
            {"type": "nemo", "manifest_filepath": "mls_fr.json", "weight": 5.0,
             "tags": {"lang": "fr", "source": "mls"}},
        ]},
        {"type": "lhotse_shar", "shar_path": "shar", "weight": 0.3, "tags": {"target_lang": "de"}},
    ]}
    (root / "input_cfg.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return root


def test_blend_compiles_to_one_manifest_with_per_corpus_counts(corpora: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.parquet"
    res = runner.invoke(app, ["compile", str(corpora / "input_cfg.yaml"), "--tokenizer", str(corpora / "spm.model"),
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    df = read_manifest(out)
    counts = dict(df.group_by("corpus").len().iter_rows())
    assert counts == {"librispeech": 12, "mls_fr": 5, "shar": 7}  # the sources' line / cut counts
    fr = df.filter(pl.col("corpus") == "mls_fr")
    # as NeMo: a `lang` tag is a cut's custom field (extra), not its supervision's language
    assert fr["lang"].null_count() == 5 and fr["task"].unique().to_list() == ["asr"]
    assert json.loads(fr["extra"][0]) == {"lang": "fr", "pnc": "yes", "source": "mls"}
    shar = df.filter(pl.col("corpus") == "shar")
    assert shar["lang"].unique().to_list() == ["de"] and shar["task"].null_count() == 7
    assert shar["container"].null_count() == 0
    meta = read_metadata(out)
    assert meta["schema_version"] == 3
    tree = meta["provenance"]["blend"]["tree"]
    assert tree["temperature"] == 0.5 and [c["weight"] for c in tree["children"]] == [0.7, 0.3]
    assert tree["children"][0]["children"][1] == {"weight": 5.0, "corpus": "mls_fr"}
    assert [c["corpus"] for c in meta["provenance"]["blend"]["corpora"]] == ["librispeech", "mls_fr", "shar"]
    res = runner.invoke(app, ["stats", str(out), "--json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    per = {c["corpus"]: c for c in json.loads((tmp_path / "s.json").read_text())["corpora"]}
    assert {k: v["utterances"] for k, v in per.items()} == counts
    assert per["shar"]["hours"] == round(shar["duration"].sum() / 3600, 4)
    assert per["shar"]["tokens"] == shar["num_tokens"].sum()


def test_one_corpus_manifest_keeps_version_1(corpora: Path, tmp_path: Path) -> None:
    out = tmp_path / "one.parquet"
    res = runner.invoke(app, ["compile", str(corpora / "ls_en.json"), "--tokenizer", str(corpora / "spm.model"),
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "corpus" not in read_manifest(out).columns and read_metadata(out)["schema_version"] == 1


@pytest.mark.parametrize(("cfg", "msg"), [
    ([{"type": "nemo", "manifest_filepath": "a.json", "weight": 1}, {"type": "nemo", "manifest_filepath": "b.json"}],
     "input_cfg[1].weight: missing"),
    ([{"type": "share_gpt", "manifest_filepath": "a.json"}], "input_cfg[0].type: 'share_gpt' is not read"),
    ([{"type": "txt"}], "input_cfg[0].paths: missing"),
    ([{"type": "txt_pair", "source_paths": ["a.txt", "b.txt"], "target_paths": ["c.txt"]}],
     "input_cfg[0].target_paths: 1 files for 2 source_paths"),
    ([{"type": "txt_pair", "source_paths": "a.txt", "target_paths": "b.txt", "questions_path": "q.txt"}],
     "input_cfg[0].questions_path: not read"),
    ([{"type": "txt", "paths": "a.txt", "language": 3}], "input_cfg[0].language: expected a non-empty string"),
    ([{"type": "multimodal_conversation", "manifest_filepath": "c.jsonl", "tarred_audio_filepaths": "c.tar"}],
     "input_cfg[0].tarred_audio_filepaths: not read for conversations"),
    ([{"type": "nemo", "manifest_filepath": "a.json", "weight": "2"}], "input_cfg[0].weight: expected a number"),
    ({"reweight_temperature": [1.0, 0.5], "input_cfg": [{"type": "nemo", "manifest_filepath": "a.json"}]},
     "reweight_temperature: 2 values for 1 nesting levels"),
    ([{"type": "nemo"}], "input_cfg[0].manifest_filepath: missing"),
])
def test_bad_blends_are_one_line_errors(tmp_path: Path, cfg: object, msg: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    with pytest.raises(ManifestError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        read_blend(path)


def test_blend_must_be_the_only_source(corpora: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["compile", str(corpora / "input_cfg.yaml"), str(corpora / "ls_en.json"),
                              "--tokenizer", str(corpora / "spm.model"), "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 2 and "must be the only source" in res.output and res.output.count("\n") == 1


def test_lang_field_and_tags_overwrite_rows(tmp_path: Path) -> None:
    from manifests.readers import Leaf, iter_leaf
    from manifests.readers._blend import tag_rows

    src = write_nemo_manifest(tmp_path / "x.json", [
        {"audio_filepath": "a.wav", "duration": 1.0, "text": "t", "language": "de", "pnc": "no", "z": {"k": 2}},
        {"audio_filepath": "b.wav", "duration": 1.0, "text": "t", "lang": "it"},
    ])
    leaf = Leaf("x", "nemo", (str(src),), lang_field="language",
                tags={"pnc": "yes", "taskname": "ast", "z": {"m": 1}})
    df = pl.concat([tag_rows(f, leaf) for f in iter_leaf(leaf)])
    assert df["lang"].to_list() == ["de", "it"] and df["task"].to_list() == ["ast", "ast"]
    assert [json.loads(e) for e in df["extra"]] == [  # each tag replaces the field whole, as NeMo's setattr
        {"language": "de", "pnc": "yes", "z": {"m": 1}}, {"pnc": "yes", "z": {"m": 1}}]
    assert df["corpus"].to_list() == ["x", "x"]
