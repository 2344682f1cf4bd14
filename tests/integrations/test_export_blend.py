"""``export nemo`` of a blend mixing loose NeMo manifests and a NeMo-tarred pack: an
``input_cfg.yaml`` that our ``compile`` and NeMo 3.0's own reader (``read_cutset_from_config``,
``nemo/collections/common/data/lhotse/cutset.py``) read back into the same rows and shares."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import yaml

from bucketing.quota import blend_probabilities
from manifests.manifest_read import read_manifest, read_metadata
from tests.compile.test_blend import _nemo
from tests.training._consumer import invoke

BLEND = {"reweight_temperature": 0.5, "input_cfg": [
    {"type": "group", "weight": 0.7, "tags": {"taskname": "asr"}, "input_cfg": [
        {"type": "nemo", "manifest_filepath": "ls_en.json", "weight": 100.0, "tags": {"corpus": "librispeech"}},
        {"type": "nemo", "manifest_filepath": "mls_fr.json", "weight": 5.0, "tags": {"source": "mls"}},
    ]},
    {"type": "nemo_tarred", "manifest_filepath": "packed/manifest__OP_0..1_CL_.json",
     "tarred_audio_filepaths": "packed/audio__OP_0..1_CL_.tar", "weight": 0.3, "tags": {"corpus": "tarred_de"}},
]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The blend compiled, fitted and exported through the CLI; the export's message."""
    from dataprep.testing import WORDS
    from dataprep.tokenize import train_model

    root = tmp_path_factory.mktemp("export-blend")
    _nemo(root, "ls_en", 12, "en")
    _nemo(root, "mls_fr", 5, "fr", pnc="yes")
    _nemo(root, "tar_src", 8, "de")
    train_model([" ".join(WORDS)] * 4, root / "spm.model", vocab_size=60, threads=1)
    invoke("compile", str(root / "tar_src.json"), "--tokenizer", str(root / "spm.model"), "-o", str(root / "t.parquet"))
    invoke("pack", str(root / "t.parquet"), "-o", str(root / "packed"), "--layout", "nemo-tarred", "--num-parts", "2")
    (root / "input_cfg.yaml").write_text(yaml.safe_dump(BLEND), encoding="utf-8")
    invoke("compile", str(root / "input_cfg.yaml"), "--tokenizer", str(root / "spm.model"), "-o", str(root / "m.parquet"))
    invoke("fit-buckets", str(root / "m.parquet"), "-o", str(root / "buckets.json"), "--num-buckets", "2",
           "--max-duration-budget", "4")
    said = invoke("export", "nemo", str(root / "buckets.json"), "-m", str(root / "m.parquet"), "-o", str(root / "out"))
    return root, said


def _tree(manifest: Path) -> dict:
    return read_metadata(manifest)["provenance"]["blend"]["tree"]


def _rows(df: pl.DataFrame) -> dict[str, list[tuple]]:
    """Per corpus: the sorted (text, duration, lang, task) of its rows."""
    out: dict[str, list[tuple]] = {}
    for r in df.iter_rows(named=True):
        out.setdefault(r["corpus"], []).append((r["text"], round(r["duration"], 3), r["lang"], r["task"]))
    return {k: sorted(v) for k, v in out.items()}


def test_a_mixed_blend_exports_an_input_cfg_that_compiles_back(exported: tuple[Path, str], tmp_path: Path) -> None:
    root, said = exported
    out = root / "out"
    assert said.strip().endswith("bucketing.yaml, input_cfg.yaml, corpus-000/, corpus-001/, corpus-002/")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "bucketing.yaml", "corpus-000/manifest.jsonl", "corpus-001/manifest.jsonl", "corpus-002/manifest_0.json",
        "corpus-002/manifest_1.json", "input_cfg.yaml"]
    cfg = json.loads((out / "bucketing.yaml").read_text())
    assert cfg["input_cfg"] == str(out.resolve() / "input_cfg.yaml") and cfg["force_iterable_dataset"] is True
    back = tmp_path / "back.parquet"
    invoke("compile", str(out / "input_cfg.yaml"), "--tokenizer", str(root / "spm.model"), "-o", str(back))
    src, again = read_manifest(root / "m.parquet"), read_manifest(back)
    assert _rows(again) == _rows(src)  # every row, its corpus and its fields
    assert again.filter(pl.col("corpus") == "tarred_de")["container"].null_count() == 0  # read from the tars
    assert blend_probabilities(_tree(back)) == pytest.approx(blend_probabilities(_tree(root / "m.parquet")), rel=1e-12)


@pytest.mark.nemo
def test_nemo_reads_the_exported_input_cfg_into_the_same_rows_and_shares(exported: tuple[Path, str]) -> None:
    pytest.importorskip("nemo.collections.asr", reason="nemo_toolkit is not installed (make test-nemo)")
    from nemo.collections.common.data.lhotse.cutset import read_cutset_from_config
    from omegaconf import OmegaConf

    root, _ = exported
    cfg = json.loads((root / "out" / "bucketing.yaml").read_text())
    cuts, _ = read_cutset_from_config(OmegaConf.create({**cfg, "force_finite": True, "shard_seed": 0}))
    src = read_manifest(root / "m.parquet")
    got: dict[str, list[tuple]] = {}
    for cut in cuts:
        sup = cut.supervisions[0]
        got.setdefault(cut.corpus, []).append((sup.text, round(cut.duration, 3), sup.language))
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(r[:3] for r in v) for k, v in _rows(src).items()}

    def leaves(it: object, p: float, out: list[float]) -> list[float]:  # NeMo's mux weights, down the tree
        its = getattr(it, "iterators", None)
        if its is None:
            out.append(p)
        else:
            for sub, w in zip(its, it.weights):  # type: ignore[attr-defined]
                leaves(getattr(sub, "data", sub), p * w, out)
        return out

    ours = blend_probabilities(_tree(root / "m.parquet"))
    assert leaves(cuts.data, 1.0, []) == pytest.approx(list(ours.values()), rel=1e-9)
    assert Counter(c.corpus for c in cuts) == Counter(src["corpus"].to_list())


@pytest.mark.nemo
def test_nemo_reads_the_loose_exports_bucketing_yaml_as_its_config(exported: tuple[Path, str], tmp_path: Path) -> None:
    """The loose export's ``bucketing.yaml`` is a whole NeMo data config: NeMo's reader takes it
    as ``train_ds`` (no ``IncompleteConfigError``: it names ``manifest_filepath``)."""
    pytest.importorskip("nemo.collections.asr", reason="nemo_toolkit is not installed (make test-nemo)")
    from nemo.collections.common.data.lhotse.cutset import read_cutset_from_config
    from nemo.collections.common.data.lhotse.dataloader import (
        make_structured_with_schema_warnings,
    )
    from omegaconf import OmegaConf

    root, _ = exported
    invoke("fit-buckets", str(root / "t.parquet"), "-o", str(tmp_path / "b.json"), "--num-buckets", "2",
           "--max-duration-budget", "4")
    invoke("export", "nemo", str(tmp_path / "b.json"), "-m", str(root / "t.parquet"), "-o", str(tmp_path / "n"))
    config = make_structured_with_schema_warnings(OmegaConf.load(tmp_path / "n" / "bucketing.yaml"))
    cuts, tarred = read_cutset_from_config(config)
    src = read_manifest(root / "t.parquet")
    assert not tarred and sorted(c.supervisions[0].text for c in cuts) == sorted(src["text"])
