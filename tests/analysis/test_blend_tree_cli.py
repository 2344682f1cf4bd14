"""``dataprep stats`` of a blend prints the blend tree docs/many-corpora.md promises: each
corpus with its weight, NeMo's probability and its rows, groups indented with their temperature."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import write_nemo_manifest
from tests.conftest import read_shared_csv

runner = CliRunner()


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_stats_of_a_blend_prints_its_tree(tmp_path: Path, shared_spm_path: Path) -> None:
    for name, csv, n in (("libri", "librispeech.dev-clean.csv", 300), ("cv", "commonvoice.id_ps.csv", 200),
                         ("test", "librispeech.test-clean.csv", 100)):
        df = read_shared_csv(csv).head(n)
        write_nemo_manifest(tmp_path / f"{name}.jsonl", [
            {"audio_filepath": f"{name}/{r['id']}.flac", "duration": r["duration"], "text": r["text"]}
            for r in df.iter_rows(named=True)])
    (tmp_path / "input_cfg.yaml").write_text(
        "reweight_temperature: [0.5, 1.0]\n"
        "input_cfg:\n"
        "  - {type: nemo, manifest_filepath: libri.jsonl, weight: 3, tags: {corpus: libri}}\n"
        "  - type: group\n"
        "    weight: 1\n"
        "    input_cfg:\n"
        "      - {type: nemo, manifest_filepath: cv.jsonl, weight: 1, tags: {corpus: cv}}\n"
        "      - {type: nemo, manifest_filepath: test.jsonl, weight: 1, tags: {corpus: test}}\n")
    m = tmp_path / "blend.parquet"
    _run("compile", str(tmp_path / "input_cfg.yaml"), "--tokenizer", str(shared_spm_path), "-o", str(m))
    out = _run("stats", str(m)).splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("Blend tree (input_cfg.yaml, temperature 0.5)"))
    tree = [line.split() for line in out[start + 1:start + 5]]
    assert [t[:3] for t in tree] == [["libri", "weight", "3"], ["group", "weight", "1"], ["cv", "weight", "1"],
                                     ["test", "weight", "1"]]
    assert out[start + 3].startswith("    cv") and out[start + 2] == "  group  weight 1  temperature 1.0"
    p = {t[0]: float(t[4]) for t in tree if t[0] != "group"}
    assert abs(sum(p.values()) - 1) < 1e-3 and p["libri"] > p["cv"] == p["test"]
    assert tree[0][5:7] == ["300", "utterances,"] and tree[2][5:7] == ["200", "utterances,"]


def test_stats_of_one_corpus_prints_no_tree(tmp_path: Path, shared_spm_path: Path) -> None:
    df = read_shared_csv("librispeech.dev-clean.csv").head(50)
    df.write_csv(tmp_path / "one.csv")
    _run("compile", str(tmp_path / "one.csv"), "--tokenizer", str(shared_spm_path), "-o", str(tmp_path / "m.parquet"))
    assert "Blend tree" not in _run("stats", str(tmp_path / "m.parquet"))
