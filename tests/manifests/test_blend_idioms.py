"""NeMo's ``input_cfg`` idioms read as NeMo 3.0 reads them, on real manifests and real audio:
tags (overwrite, outer group wins), two views of one manifest, one relative name in two folders,
``${oc.env:...}``, ``6e-1``, nested files, ``[[path, weight]]``, unused keys; and their one-line
errors. :func:`build_blend` is shared with the NeMo-marked comparison (test_blend_nemo.py)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.errors import ManifestError
from manifests.manifest_read import read_manifest, read_metadata
from manifests.nemo_buckets import nemo_to_buckets_json
from manifests.nemo_yaml import load_nemo_yaml
from manifests.readers import read_blend

runner = CliRunner()
ENV = "DATAPREP_TEST_BLEND_DATA"

BLEND = """\
reweight_temperature: [1.0, 0.5]
use_bucketing: true
max_duration: 20
channel_selector: average
force_iterable_dataset: true
input_cfg:
  - type: group
    weight: 6e-1
    tags: {pnc: "yes", taskname: asr}
    input_cfg:
      - {type: nemo, manifest_filepath: "${oc.env:ENV}/a.json", weight: 3, tags: {leaf: asr, pnc: "no"}}
      - type: nemo
        manifest_filepath: ${oc.env:ENV}/a.json
        text_field: answer
        weight: 1
        tags: {leaf: ast, target_lang: de, taskname: ast}
  - type: group
    weight: 4e-1
    input_cfg: sub.yaml
""".replace("ENV", ENV)
SUB = """\
- type: nemo_tarred
  manifest_filepath: [[x/manifest_0.json, 2.0], [y/manifest_0.json, 1.0]]
  tarred_audio_filepaths: [[x/audio_0.tar], [y/audio_0.tar]]
  tags: {leaf: xy}
"""


def build_blend(root: Path) -> Path:
    """A blend of 20 rows read twice (ASR view and ``text_field: answer`` view), and two NeMo
    tarred sets in two folders whose members have the same names (different audio), weighted
    ``[[path, weight]]`` in a nested file."""
    rows = []
    for i in range(20):
        path = write_tone(root / "audio_a" / f"a{i}.flac", 0.5 + 0.05 * i, seed=i)
        rows.append({"audio_filepath": f"audio_a/a{i}.flac", "duration": 0.5 + 0.05 * i,
                     "text": " ".join(WORDS[i:i + 3]), "answer": " ".join(WORDS[i + 50:i + 52]),
                     "source_lang": "en", "target_lang": "en", **({"pnc": "no"} if i < 10 else {})})
        assert path.exists()
    write_nemo_manifest(root / "a.json", rows)
    for k, folder in enumerate(("x", "y")):  # NeMo tarred sets whose members have the same names
        lines = []
        (root / folder).mkdir()
        with tarfile.open(root / folder / "audio_0.tar", "w") as tar:
            for i in range(3):
                clip = write_tone(root / "clips" / folder / f"u{i}.flac", 0.6 + 0.1 * i + 0.01 * k, seed=10 * k + i)
                tar.add(clip, arcname=f"u{i}.flac")
                lines.append({"audio_filepath": f"u{i}.flac", "duration": 0.6 + 0.1 * i + 0.01 * k, "shard_id": 0,
                              "text": " ".join(WORDS[i + k:i + k + 2]), "source_lang": "en", "target_lang": "en"})
        write_nemo_manifest(root / folder / "manifest_0.json", lines)
    (root / "sub.yaml").write_text(SUB, encoding="utf-8")
    (root / "blend.yaml").write_text(BLEND, encoding="utf-8")
    return root / "blend.yaml"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("idioms")
    blend = build_blend(root)
    train_model([" ".join(WORDS)] * 4, root / "spm.model", vocab_size=80, threads=1)
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV, str(root))
    try:
        res = runner.invoke(app, ["compile", str(blend), "--tokenizer", str(root / "spm.model"), "-o",
                                  str(root / "m.parquet")])
    finally:
        mp.undo()
    assert res.exit_code == 0, res.output
    return root, root / "m.parquet", res.output


def test_tags_overwrite_fields_and_the_outer_group_wins(compiled: tuple[Path, Path, str]) -> None:
    df = read_manifest(compiled[1])
    views = df.filter(pl.col("corpus").is_in(["a", "a.answer"]))
    pnc = [json.loads(e)["pnc"] for e in views["extra"]]
    assert len(pnc) == 40 and set(pnc) == {"yes"}  # 10 rows said "no", the leaf tag said "no": the group's wins
    assert set(views["task"]) == {"asr"}  # the AST view's own taskname loses to its group's, as in NeMo
    ast = df.filter(pl.col("corpus") == "a.answer")
    assert set(ast["target_lang"]) == {"de"} and set(ast["lang"]) == {"de"}  # lang follows the tagged target


def test_two_views_and_two_folders_keep_every_row(compiled: tuple[Path, Path, str]) -> None:
    root, out, _ = compiled
    df = read_manifest(out)
    assert dict(df.group_by("corpus").len().iter_rows()) == {"a": 20, "a.answer": 20, "manifest_0": 3, "y/manifest_0": 3}
    assert df["id"].n_unique() == df.height == 46
    a, ans = df.filter(pl.col("corpus") == "a"), df.filter(pl.col("corpus") == "a.answer")
    assert ans["id"].to_list() == ["a.answer:" + i for i in a["id"]]  # the second view's ids qualified
    assert ans["text"].to_list() != a["text"].to_list() and ans["text"][0] == " ".join(WORDS[50:52])
    y = df.filter(pl.col("corpus") == "y/manifest_0")
    assert y["id"][0] == "y/manifest_0:u0.flac" and y["container"][0] == str(root / "y" / "audio_0.tar")
    assert pl.read_parquet(out.with_name("m.rejects.parquet")).height == 0
    tree = read_metadata(out)["provenance"]["blend"]["tree"]
    assert [c["weight"] for c in tree["children"]] == [0.6, 0.4]  # 6e-1 is a float, as OmegaConf reads it
    assert tree["children"][1]["children"][0] == {"weight": None, "temperature": 1.0, "children": [
        {"weight": 2.0, "corpus": "manifest_0"}, {"weight": 1.0, "corpus": "y/manifest_0"}]}


def test_unused_keys_and_renamed_corpora_are_one_warning_line_each(compiled: tuple[Path, Path, str]) -> None:
    lines = [ln for ln in compiled[2].splitlines() if ln.startswith("warning: ")]
    assert len(lines) == 2, compiled[2]
    assert "use_bucketing" in lines[0] and "max_duration" in lines[0] and "channel_selector" in lines[0]
    assert "force_iterable_dataset" in lines[0] and "a.answer" in lines[1] and "y/manifest_0" in lines[1]


def test_weighted_plan_of_two_views(compiled: tuple[Path, Path, str], tmp_path: Path) -> None:
    out = compiled[1]
    (tmp_path / "b.yaml").write_text("train_ds:\n  use_bucketing: true\n  bucket_duration_bins: [2.0]\n"
                                     "  batch_duration: 8\n  max_duration: 20\n  max_tps: 12\n", encoding="utf-8")
    res = runner.invoke(app, ["plan-batches", str(out), "--buckets", str(tmp_path / "b.yaml"), "--world-size", "1",
                              "--epoch-utterances", "40", "-o", str(tmp_path / "plan")])
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.output.splitlines() if "not used by dataprep" in ln]
    assert len(warned) == 1 and warned[0].endswith(": max_duration, max_tps"), res.output
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["buckets"][0]["batch_size"] == 4  # 8 s / 2 s


def test_true_duplicate_is_named(tmp_path: Path) -> None:
    write_tone(tmp_path / "u.flac", 0.5)
    write_nemo_manifest(tmp_path / "d.json", [{"audio_filepath": "u.flac", "duration": 0.5, "text": "a b"}] * 2)
    (tmp_path / "b.yaml").write_text("- {type: nemo, manifest_filepath: d.json}\n", encoding="utf-8")
    train_model([" ".join(WORDS)] * 4, tmp_path / "spm.model", vocab_size=60, threads=1)
    res = runner.invoke(app, ["compile", str(tmp_path / "b.yaml"), "--tokenizer", str(tmp_path / "spm.model"),
                              "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 0, res.output
    rej = pl.read_parquet(tmp_path / "m.rejects.parquet")
    assert rej["reason"].to_list() == ["duplicate_id"]
    assert "duplicate id u.flac (first at " in rej["detail"][0] and "d.json:1" in rej["detail"][0]


def test_interpolation_as_omegaconf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DP_ROOT", "/data")
    monkeypatch.delenv("DP_UNSET", raising=False)
    (tmp_path / "c.yaml").write_text(
        "root: ${oc.env:DP_ROOT}\nm: ${root}/a.json\nn: ${oc.env:DP_UNSET,null}\nd: ${oc.env:DP_UNSET,'/x'}\n"
        "w: ${oc.decode:'2.5'}\nsub:\n  a: ${..w}\n  b: ${.a}\nlit: '\\${root}'\nf: 1e-3\ng: ['${sub.b}']\n",
        encoding="utf-8")
    assert load_nemo_yaml(tmp_path / "c.yaml") == {
        "root": "/data", "m": "/data/a.json", "n": None, "d": "/x", "w": 2.5, "sub": {"a": 2.5, "b": 2.5},
        "lit": "${root}", "f": 0.001, "g": [2.5]}


@pytest.mark.parametrize(("text", "msg"), [
    ("a: ${oc.env:DP_UNSET}/m.json\n", "a: environment variable 'DP_UNSET' is not set"),
    ("a: ${b}\nb: ${a}\n", "refers back to itself (a cycle)"),
    ("a: ${nope.x}\n", "a: ${nope.x}: no such key in the file"),
    ("a: '${oc.create:{x: 1}}'\n", "a list or mapping inside an interpolation is not read"),
    ("a: ${oc.dict.keys:b}\nb: {}\n", "resolver 'oc.dict.keys' is not read"),
    ("a: ${python:os.system}\n", "resolver 'python' is not read"),
    ("a: ${b\n", "is not closed"),
    ("a: 1\na: 2\n", "key 'a' appears twice"),
    ("".join(f"{a}: {('${' + b + '}') * 8}\n" for a, b in zip("abcdefg", "bcdefgh")) + "h: xxxxxxxxxxxxxxxx\n",
     "characters; refused"),  # 16 * 8**7 characters
])
def test_interpolation_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                           msg: str) -> None:
    monkeypatch.delenv("DP_UNSET", raising=False)
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError) as exc:
        load_nemo_yaml(tmp_path / "c.yaml")
    assert msg in str(exc.value) and "\n" not in str(exc.value) and str(tmp_path / "c.yaml") in str(exc.value)


def test_unset_variable_is_named_by_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DP_UNSET", raising=False)
    (tmp_path / "b.yaml").write_text("- {type: nemo, manifest_filepath: '${oc.env:DP_UNSET}/a.json'}\n", encoding="utf-8")
    res = runner.invoke(app, ["compile", str(tmp_path / "b.yaml"), "--tokenizer", str(tmp_path / "none.model"),
                              "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "b.yaml: [0].manifest_filepath: environment variable 'DP_UNSET' is not set" in res.output, res.output


@pytest.mark.parametrize(("files", "msg"), [
    ({"b.yaml": "- {type: group, input_cfg: b.yaml}\n"}, "input_cfg[0].input_cfg: includes itself (b.yaml -> b.yaml)"),
    ({"b.yaml": "- {type: group, input_cfg: c.yaml}\n", "c.yaml": "- {type: group, input_cfg: b.yaml}\n"},
     "includes itself (b.yaml -> c.yaml -> b.yaml)"),
    ({"b.yaml": "input_cfg: c.yaml\n", "c.yaml": "input_cfg: []\n"}, "c.yaml: input_cfg: a nested input_cfg file"),
    ({"b.yaml": "- {type: group, input_cfg: nope.yaml}\n"}, "nope.yaml: no such file (the input_cfg of"),
    ({"b.yaml": "- {type: nemo, manifest_filepath: [[a.json, 2], [b.json, '1']]}\n"},
     "input_cfg[0].manifest_filepath[1][1]: expected a number"),
    ({"b.yaml": "- {type: nemo_tarred, manifest_filepath: [[a.json, 2], [b.json, 1]], tarred_audio_filepaths: [a.tar]}\n"},
     "tarred_audio_filepaths: expected a list of 2 entries"),
])
def test_nested_files_and_lists_errors(tmp_path: Path, files: dict[str, str], msg: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError) as exc:
        read_blend(tmp_path / "b.yaml")
    assert msg in str(exc.value) and "\n" not in str(exc.value)


def _doubling_files(root: Path, levels: int) -> Path:
    """``levels`` files, each listing the next twice: 2**(levels - 1) datasets from a few lines."""
    for k in range(levels):
        nxt = f"f{k + 1}.yaml" if k < levels - 1 else None
        text = f"- {{type: group, input_cfg: {nxt}}}\n" * 2 if nxt else "- {type: nemo, manifest_filepath: a.json}\n"
        (root / f"f{k}.yaml").write_text(text, encoding="utf-8")
    return root / "f0.yaml"


def test_includes_that_explode_are_refused(tmp_path: Path) -> None:
    blend = read_blend(_doubling_files(tmp_path, 8))  # 128 corpora: read, each named apart
    assert len(blend.leaves) == 128 and len({leaf.corpus for leaf in blend.leaves}) == 128
    with pytest.raises(ManifestError, match=r"expands to more than 10,000 datasets; refused"):
        read_blend(_doubling_files(tmp_path / "big", 16) if (tmp_path / "big").mkdir() is None else None)


def write_shar(root: Path, name: str, n: int, seed: int) -> Path:
    """A Lhotse Shar folder of ``n`` real cuts in shards of 2."""
    lhotse = pytest.importorskip("lhotse")
    cuts = []
    for i in range(n):
        clip = write_tone(root / f"{name}_src" / f"{i}.flac", 0.5 + 0.05 * i, seed=seed + i)
        rec = lhotse.Recording.from_file(clip, recording_id=f"{name}-rec{i}")
        sup = lhotse.SupervisionSegment(id=f"{name}-{i}", recording_id=rec.id, start=0, duration=rec.duration,
                                        text=" ".join(WORDS[seed + i:seed + i + 2]), language="en")
        cuts.append(lhotse.MonoCut(id=f"{name}-{i}", start=0, duration=rec.duration, channel=0, recording=rec,
                                   supervisions=[sup], custom={"source_lang": "en", "target_lang": "en"}))
    (root / name).mkdir()
    lhotse.CutSet.from_cuts(cuts).to_shar(root / name, fields={"recording": "flac"}, shard_size=2)
    return root / name


SHAR_BLEND = """\
- type: lhotse_shar
  weight: 2
  tags: {leaf: fields}
  shar_path:
    cuts: s1/cuts.{000000..000001}.jsonl.gz
    recording: [s1/recording.000000.tar, s1/recording.000001.tar]
- {type: lhotse_shar, weight: 1, shar_path: [[s2, 3.0], [s3, 1.0]], tags: {leaf: pairs}}
- {type: lhotse_shar, weight: 1, shar_path: [s2, s3], tags: {leaf: list}}
"""


def build_shar_blend(root: Path) -> Path:
    """Lhotse Shar given three NeMo ways: fields with a brace pattern, [[folder, weight]], a list."""
    write_shar(root, "s1", 4, 0), write_shar(root, "s2", 3, 10), write_shar(root, "s3", 2, 20)
    (root / "shar.yaml").write_text(SHAR_BLEND, encoding="utf-8")
    return root / "shar.yaml"


def test_shar_path_as_fields_pairs_and_list(tmp_path: Path) -> None:
    blend = build_shar_blend(tmp_path)
    train_model([" ".join(WORDS)] * 4, tmp_path / "spm.model", vocab_size=80, threads=1)
    res = runner.invoke(app, ["compile", str(blend), "--tokenizer", str(tmp_path / "spm.model"), "-o",
                              str(tmp_path / "m.parquet")])
    assert res.exit_code == 0, res.output
    df = read_manifest(tmp_path / "m.parquet")
    both = f"{tmp_path.name}/s2"  # the list's corpus: named by its first folder, qualified by its parent
    assert dict(df.group_by("corpus").len().iter_rows()) == {"s1": 4, "s2": 3, "s3": 2, both: 5}
    assert pl.read_parquet(tmp_path / "m.rejects.parquet").height == 0
    assert set(df.filter(pl.col("corpus") == both)["id"]) == {f"{both}:s2-{i}" for i in range(3)} | {
        f"{both}:s3-{i}" for i in range(2)}
    tree = read_metadata(tmp_path / "m.parquet")["provenance"]["blend"]["tree"]
    assert tree["children"][1]["children"] == [{"weight": 3.0, "corpus": "s2"}, {"weight": 1.0, "corpus": "s3"}]
    (tmp_path / "bad.yaml").write_text("- {type: lhotse_shar, shar_path: {cuts: s1/cuts.000000.jsonl.gz, "
                                       "recording: [s1/recording.000000.tar, s1/recording.000001.tar]}}\n")
    with pytest.raises(ManifestError, match=r"bad.yaml: input_cfg\[0\].shar_path.recording: 2 tars for 1 cuts files"):
        read_blend(tmp_path / "bad.yaml")


def test_bucketing_yaml_batch_duration(tmp_path: Path) -> None:
    opts = {"model": {"train_ds": {"use_bucketing": True, "bucket_duration_bins": [2.0, 5.0], "batch_duration": 60,
                                   "quadratic_duration": 30, "max_duration": 20, "max_tps": 12, "num_workers": 2}}}
    spec = nemo_to_buckets_json(opts, "b.yaml")
    assert [b["batch_size"] for b in spec["buckets"]] == [int(60 // (2 + 4 / 30)), int(60 // (5 + 25 / 30))]
    assert spec["batch_size_source"]["rule"] == "nemo batch_duration"
    assert spec["fit"]["not_used"] == ["max_duration", "max_tps", "num_workers"]
    with pytest.raises(ManifestError, match="fit-buckets MANIFEST --num-buckets 30 --max-duration-budget 600"):
        nemo_to_buckets_json({"use_bucketing": True, "batch_duration": 600}, "b.yaml")
    with pytest.raises(ManifestError, match="b.yaml: batch_duration: 1 s holds no clip of bucket 1"):
        nemo_to_buckets_json({"bucket_duration_bins": [1.0, 5.0], "batch_duration": 1}, "b.yaml")
