"""NeMo (Canary) over packed copies of the rich corpus (NeMo tarred and Lhotse Shar): the plan's
batches through ``get_plan_dataloader`` and NeMo's canary2 dataset, NeMo's prompt formatter on
every packed cut, NeMo's own tarred reader on our export, and a tiny Canary model trained by
Lightning on a plan of each pack (3 steps; and NeMo's ``max_epochs: -1`` run to the plan's end, exit 0,
where it stops with one line). Marked ``nemo``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from manifests.manifest_read import read_manifest
from manifests.plan_files import open_shard
from tests.conftest import needs_module
from tests.integrations._rich import Rich, rich_corpus
from tests.integrations.test_nemo import tokenizer  # noqa: F401  (the module's fixture)
from tests.integrations.test_packed_consumers import compile_packed
from tests.training._consumer import invoke
from tests.warm_python import TRAINERS, run_python

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nemo,
              needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


@pytest.fixture(scope="module", params=["nemo-tarred", "shar"])
def packed(request: pytest.FixtureRequest, rich: Rich, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    layout = request.param
    root = tmp_path_factory.mktemp(f"nemo-packed-{layout}")
    invoke("pack", str(rich.manifest), "-o", str(root / "packed"), "--layout", layout, "--num-parts", "2")
    manifest = compile_packed(rich, root / "packed", layout, 2, root / "m.parquet")
    plan = root / "plan"
    invoke("plan-batches", str(manifest), "--buckets", str(rich.buckets), "--world-size", "2", "--seed", "0",
           "-o", str(plan))
    return layout, manifest, plan


def test_canary2_counts_and_labels_of_every_packed_cut(packed: tuple[str, Path, Path], rich: Rich,
                                                       tokenizer: Any) -> None:  # noqa: F811
    from nemo.collections.common.data.lhotse.dataloader import tokenize_with_prompt

    from dataprep.integrations.cuts import cut_for_row

    _, manifest, _ = packed
    loose = {r["id"]: r for r in read_manifest(rich.manifest).to_dicts()}
    for row in read_manifest(manifest).to_dicts():
        src = loose[json.loads(row["extra"])["source_id"]]
        cut = cut_for_row(row, channel=0)
        want = json.loads(src["extra"])
        assert {k: cut.custom.get(k) for k in ("pnc", "decodercontext")} == {k: want.get(k) for k in ("pnc", "decodercontext")}
        assert (cut.custom["source_lang"], cut.custom["target_lang"]) == (src["source_lang"], src["target_lang"])
        assert len(tokenize_with_prompt(cut, tokenizer, "canary2").input_ids) == row["num_tokens"] == src["num_tokens"]


def test_get_plan_dataloader_over_the_pack_yields_the_plan(packed: tuple[str, Path, Path], tokenizer: Any) -> None:  # noqa: F811
    from nemo.collections.asr.data.audio_to_text_lhotse_prompted import (
        PromptedAudioToTextLhotseDataset,
    )
    from nemo.collections.common.prompts import Canary2PromptFormatter

    from dataprep.integrations.lhotse import PlanEnded
    from dataprep.integrations.nemo import get_plan_dataloader

    _, manifest, plan = packed
    tokens = dict(zip(read_manifest(manifest)["id"], read_manifest(manifest)["num_tokens"]))
    for rank, (workers, iterable) in enumerate([(2, False), (2, True)]):
        config = {"use_lhotse": True, "plan_dir": str(plan), "manifest": str(manifest), "sample_rate": 16000,
                  "channel_selector": 0, "num_workers": workers, "force_iterable_dataset": iterable}
        dataset = PromptedAudioToTextLhotseDataset(tokenizer=tokenizer, prompt=Canary2PromptFormatter(tokenizer))
        loader = get_plan_dataloader(config, global_rank=rank, world_size=2, dataset=dataset, tokenizer=tokenizer)
        got = []
        for batch in loader:
            ids = [c.id for c in batch.cuts]
            got.append(ids)
            assert batch.audio.shape[0] == len(ids) and batch.audio.dim() == 2
            assert batch.prompted_transcript_lens.tolist() == [tokens[i] for i in ids]
        assert got == [b.ids for b in open_shard(plan, rank)]
        with pytest.raises(PlanEnded):  # max_epochs: -1 asks for another epoch
            iter(loader)


def test_nemo_reads_the_tarred_export(packed: tuple[str, Path, Path], tmp_path: Path) -> None:
    from nemo.collections.common.data.lhotse.nemo_adapters import LazyNeMoTarredIterator

    from dataprep.integrations.export import export_nemo

    layout, manifest, plan = packed
    if layout != "nemo-tarred":
        pytest.skip("NeMo's tarred reader names shards audio_<k>.tar only (refusal tested without NeMo)")
    cfg = export_nemo(plan, manifest, tmp_path / "nemo")
    it = LazyNeMoTarredIterator(cfg["manifest_filepath"], cfg["tarred_audio_filepaths"],
                                skip_missing_manifest_entries=cfg["skip_missing_manifest_entries"])
    cuts = list(it)
    df = read_manifest(manifest)
    assert len(cuts) == df.height
    assert sorted(c.supervisions[0].text for c in cuts) == sorted(df["text"])
    assert {c.custom["pnc"] for c in cuts} == {"yes", "no"}
    assert all(c.load_audio().shape[-1] > 0 for c in cuts)


def _train(plan: Path, manifest: Path, rich: Rich, work: Path, max_steps: int) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True, exist_ok=True)
    return run_python(["-m", "tests.integrations._canary_train", str(plan), str(manifest), str(rich.spm), str(work),
                       str(max_steps)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, preload=TRAINERS)


def test_a_tiny_canary_trains_on_the_plan_of_the_pack(packed: tuple[str, Path, Path], rich: Rich,
                                                      tmp_path: Path) -> None:
    """NeMo's own model (``EncDecMultiTaskModel``, canary2), Lightning and ``get_plan_dataloader``:
    the ids of each step are the plan's. On the Shar pack, NeMo's usual ``max_epochs: -1``
    without ``max_steps``: every step of the plan, then one line and exit status 0 (``fit()``
    returns; the guard is the loader's, not the layout's, so once is enough); on the tarred pack,
    three steps (``max_steps``)."""
    layout, manifest, _ = packed
    plan = tmp_path / "plan1"
    invoke("plan-batches", str(manifest), "--buckets", str(rich.buckets), "--world-size", "1", "--seed", "0",
           "-o", str(plan))
    to_end = layout == "shar"
    run = _train(plan, manifest, rich, tmp_path / "run", -1 if to_end else 3)
    assert run.returncode == 0, run.stderr[-3000:]
    n = json.loads((plan / "plan.json").read_text())["num_steps"]
    steps = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    expected = [b.ids for b in open_shard(plan, 0)][:n if to_end else 3]
    assert [s["ids"] for s in steps] == expected
    assert [s["step"] for s in steps] == list(range(len(expected)))
    assert "Traceback" not in run.stderr
    if to_end:
        ends = [x for x in run.stderr.splitlines() if "the plan's end" in x]
        assert ends == [f"{plan}: the plan's end: rank 0 trained every batch up to step {n} (plan.json num_steps {n}); "
                        "stopping the run"]
