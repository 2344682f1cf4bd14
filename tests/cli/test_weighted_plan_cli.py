"""Weighted plans as a user runs them: ``compile input_cfg.yaml`` (reweight_temperature 0.5) then
``plan-batches``: every epoch holds exactly each corpus's quota, an under-sampled corpus is
covered before any repeat; ``--weights`` / ``--temperature`` override; replan keeps quotas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from bucketing.quota import blend_probabilities, quotas
from dataprep.cli import app
from manifests.manifest_read import read_manifest
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta
from tests.compile.test_blend import corpora  # noqa: F401 (the blend fixture: 12 + 5 rows in a group, 7 in Shar)

runner = CliRunner()


def _ok(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def compiled(corpora: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("weighted")
    manifest = root / "m.parquet"
    _ok("compile", str(corpora / "input_cfg.yaml"), "--tokenizer", str(corpora / "spm.model"), "-o", str(manifest))
    buckets = root / "buckets.json"
    buckets.write_text(json.dumps({"version": 1, "buckets": [{"index": 0, "max_duration": 0.75, "batch_size": 3},
                                                             {"index": 1, "max_duration": 2.0, "batch_size": 2}]}))
    return manifest, buckets


def _epoch_rows(plan: Path) -> dict[int, np.ndarray]:
    meta = read_plan_meta(plan)
    out: dict[int, list[np.ndarray]] = {}
    for r in range(meta.world_size):
        t = PlanShard(plan, r).read(meta.first_step, columns=["epoch", "rows"])
        for e in set(t.column("epoch").to_pylist()):
            sel = t.filter(pc.equal(t.column("epoch"), e))
            out.setdefault(e, []).append(pc.list_flatten(sel.column("rows")).to_numpy())
    return {e: np.concatenate(v) for e, v in sorted(out.items())}


def test_each_epoch_gives_each_corpus_its_quota(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, buckets = compiled
    out = _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "2", "--epochs", "4", "-o",
              str(tmp_path / "plan"))
    assert "per corpus" in out and "mls_fr" in out
    meta = read_plan_meta(tmp_path / "plan")
    w = meta.extra["weights"]
    assert w["source"] == "manifest" and w["tree"]["temperature"] == 0.5
    corpus = read_manifest(manifest)["corpus"].to_list()
    names = [c["corpus"] for c in w["corpora"]]
    p = blend_probabilities(w["tree"])  # NeMo's: top (0.7, 0.3) and inner (100, 5) each to the power 0.5
    top = np.sqrt([0.7, 0.3]) / np.sqrt([0.7, 0.3]).sum()
    inner = np.sqrt([100.0, 5.0]) / np.sqrt([100.0, 5.0]).sum()
    assert [p[n] for n in names] == pytest.approx([top[0] * inner[0], top[0] * inner[1], top[1]])
    q = quotas([p[n] for n in names], len(corpus)).tolist()
    assert [c["quota"] for c in w["corpora"]] == q == [12, 3, 9]
    codes = np.array([names.index(c) for c in corpus])
    seen = np.zeros(len(corpus), np.int64)
    for e, rows in _epoch_rows(tmp_path / "plan").items():
        assert np.bincount(codes[rows], minlength=3).tolist() == q  # exactly the quota, every epoch
        times = np.bincount(rows, minlength=len(corpus))
        assert set(times[codes == 2]) == {1, 2}  # Shar: 9 of 7 rows, each once or twice
        seen += times
        fr = seen[codes == 1]
        assert fr.max() - fr.min() <= 1  # mls_fr (3 of 5 per epoch): all rows before any repeat
    assert seen[codes == 1].sum() == 12 and seen[codes == 1].min() == 2
    again = tmp_path / "again"
    _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "2", "--epochs", "4", "-o", str(again))
    for f in ("rank-00000.parquet", "rank-00001.parquet"):
        assert (again / f).read_bytes() == (tmp_path / "plan" / f).read_bytes()
    assert "every corpus's quota in 4 whole epochs" in _ok("verify", str(again), "--manifest", str(manifest))


def test_weights_and_temperature_override(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, buckets = compiled
    _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "1", "--epochs", "2", "-o", str(tmp_path / "p"),
        "--weights", "librispeech=1", "--weights", "mls_fr=1", "--weights", "shar=2", "--epoch-utterances", "40")
    w = read_plan_meta(tmp_path / "p").extra["weights"]
    assert w["source"] == "options" and [c["quota"] for c in w["corpora"]] == [10, 10, 20]
    assert [c["repeats"] for c in w["corpora"]] == [[0, 1], [2, 2], [2, 3]]
    _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "1", "-o", str(tmp_path / "t0"),
        "--temperature", "0")
    w0 = read_plan_meta(tmp_path / "t0").extra["weights"]
    assert [c["probability"] for c in w0["corpora"]] == pytest.approx([0.25, 0.25, 0.5])
    for args, msg in ((["--weights", "librispeech=1"], "corpus 'mls_fr' has no weight"),
                      (["--weights", "x"], "expected CORPUS=WEIGHT"),
                      (["--weights", "shar=-1"], "expected CORPUS=WEIGHT"),
                      (["--temperature", "-1"], "--temperature"),
                      (["--epoch-utterances", "5", "--epoch-hours", "1"], "not both")):
        res = runner.invoke(app, ["plan-batches", str(manifest), "--buckets", str(buckets), "-w", "1", "-o",
                                  str(tmp_path / "bad"), *args])
        assert res.exit_code == 2 and msg in res.output and res.output.count("\n") == 1, res.output


def test_weighted_plan_over_the_memory_limit_equals_in_memory(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    """Under a --memory-limit below the in-memory need, the weighted blend is drawn bucket by
    bucket from the spill files: the same shards and plan.json (quotas, per-corpus padding)."""
    manifest, buckets = compiled
    for out, extra in (("mem", []), ("ooc", ["--memory-limit", "2300"])):
        _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "2", "--epochs", "3", "-o",
            str(tmp_path / out), *extra)
    for name in sorted(p.name for p in (tmp_path / "mem").iterdir()):
        assert (tmp_path / "mem" / name).read_bytes() == (tmp_path / "ooc" / name).read_bytes(), name
    _ok("verify", str(tmp_path / "ooc"), "--manifest", str(manifest))
    res = runner.invoke(app, ["plan-batches", str(manifest), "--buckets", str(buckets), "-w", "1", "-o",
                              str(tmp_path / "bad"), "--weights", "librispeech=1", "--memory-limit", "2300"])
    assert res.exit_code == 2 and "corpus 'mls_fr' has no weight" in res.output, res.output
    assert res.output.count("\n") == 1 and not (tmp_path / "bad").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".spill")]  # the spill is removed


def test_replan_of_a_weighted_plan_keeps_each_epochs_quota(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, buckets = compiled
    _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "2", "--epochs", "3", "-o",
        str(tmp_path / "plan"))
    parent = read_plan_meta(tmp_path / "plan")
    at = parent.first_step_of_epoch[1] + 2
    _ok("replan", str(tmp_path / "plan"), "--at-step", str(at), "-w", "1", "--manifest", str(manifest), "-o",
        str(tmp_path / "re"))
    old, new = _epoch_rows(tmp_path / "plan"), _epoch_rows(tmp_path / "re")
    consumed = []
    for r in range(parent.world_size):
        t = PlanShard(tmp_path / "plan", r).read(parent.first_step_of_epoch[1], columns=["step", "rows"])
        t = t.filter(pc.less(t.column("step"), at))
        consumed.append(pc.list_flatten(t.column("rows")).to_numpy())
    epoch1 = np.sort(np.concatenate([*consumed, new[1]]))
    assert np.array_equal(epoch1, np.sort(old[1]))  # the rest of epoch 1: exactly the unseen multiset
    assert np.array_equal(np.sort(new[2]), np.sort(old[2]))  # later epochs: the same quota draws
    assert "quota in 1 whole epoch" in _ok("verify", str(tmp_path / "re"), "--manifest", str(manifest))


def test_check_quotas_finds_a_wrong_count(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    from dataprep.planning.weights import check_quotas
    from manifests.errors import DataprepError
    from manifests.plan_meta import plan_hash_of

    manifest, buckets = compiled
    _ok("plan-batches", str(manifest), "--buckets", str(buckets), "-w", "1", "--epochs", "2", "-o", str(tmp_path / "p"))
    assert check_quotas(tmp_path / "p", manifest) == 2
    for block in (1, 5, 11):  # the corpus codes in blocks: one pass over the plan per block
        assert check_quotas(tmp_path / "p", manifest, block_rows=block) == 2
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    doc["weights"]["corpora"][1]["quota"] += 1
    doc["plan_hash"] = plan_hash_of(doc)  # an edit the hash check alone would not see: the quotas must
    (tmp_path / "p" / "plan.json").write_text(json.dumps(doc))
    for block in (None, 3):
        with pytest.raises(DataprepError, match="epoch 0: corpus 'mls_fr' has 3 utterances, its quota is 4"):
            check_quotas(tmp_path / "p", manifest, *([block] if block else []))


def test_padding_reports_each_corpus(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, buckets = compiled
    out = _ok("padding", str(manifest), "--buckets", str(buckets), "--json", str(tmp_path / "p.json"))
    assert "2D scheme per corpus" in out
    per = {c["corpus"]: c for c in json.loads((tmp_path / "p.json").read_text())["per_corpus"]}
    df = read_manifest(manifest)
    assert {k: v["utterances"] for k, v in per.items()} == dict(df.group_by("corpus").len().iter_rows())
    assert all(0 <= v["padding_audio"] < 1 for v in per.values())


def test_exports_keep_the_corpus(compiled: tuple[Path, Path], tmp_path: Path) -> None:
    manifest, buckets = compiled
    # the blend mixes loose files and a Shar corpus: NeMo's export refuses the mix (one kind per
    # dataset), so its loose rows are exported alone; Lhotse's export takes every row
    import polars as pl

    from manifests.manifest_read import read_manifest
    from manifests.manifest_write import write_manifest

    loose = tmp_path / "loose.parquet"
    write_manifest(read_manifest(manifest).filter(pl.col("corpus") != "shar"), loose)
    _ok("export", "nemo", str(buckets), "--manifest", str(loose), "-o", str(tmp_path / "nemo"))
    lines = [json.loads(x) for x in (tmp_path / "nemo" / "manifest.jsonl").read_text().splitlines()]
    assert sorted({x["corpus"] for x in lines}) == ["librispeech", "mls_fr"]
    _ok("export", "lhotse", str(buckets), "--manifest", str(manifest), "-o", str(tmp_path / "lhotse"))
    import gzip

    # rows held in containers: the export is a Lhotse Shar set (shar/cuts.NNNNNN.jsonl.gz)
    cuts = [json.loads(x) for f in sorted((tmp_path / "lhotse" / "shar").glob("cuts.*.jsonl.gz"))
            for x in gzip.open(f, "rt")]
    assert sorted({c["custom"]["corpus"] for c in cuts}) == ["librispeech", "mls_fr", "shar"]
