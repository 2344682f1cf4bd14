"""Elastic re-plan with real torch.distributed (gloo): a 2-rank run stopped at step K, the plan
re-planned at K for 1 and for 3 ranks, the checkpoint resumed on it: the epoch finishes with
every utterance seen exactly once (consumed steps of the old ranks + the new ranks' steps)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dataprep.cli import app
from manifests.manifest_read import read_manifest
from tests.training._consumer import Corpus, build_corpus, invoke, runner
from tests.training.test_train_ddp import read_jsonl, train_args


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("replan-corpus"), num_tones=24, shared_limit=6)


def traces(ckpt: Path) -> list[dict]:
    return [t for p in sorted(ckpt.glob("trace-rank-*.jsonl")) for t in read_jsonl(p)]


@pytest.mark.parametrize("balance", [pytest.param("0", marks=pytest.mark.slow), "0.05"])
def test_stop_replan_resume_sees_every_utterance_once(corpus: Corpus, tmp_path: Path, balance: str) -> None:
    plan = tmp_path / "plan"
    invoke("plan-batches", str(corpus.manifest), "--buckets", str(corpus.buckets), "--world-size", "2",
           "--balance", balance, "-o", str(plan))
    n = json.loads((plan / "plan.json").read_text())["num_steps"]
    assert n >= 4
    k = n // 2
    part = tmp_path / "part"
    invoke(*train_args(corpus, plan, part, "--nproc", "2", "--trace", "--steps", str(k)))
    ids = read_manifest(corpus.manifest)["id"].to_list()
    for w2 in (1, 3):
        ckpt = tmp_path / f"ckpt-{w2}"
        shutil.copytree(part, ckpt)
        plan2 = tmp_path / f"plan-{w2}"
        invoke("replan", str(plan), "--at-step", str(k), "--world-size", str(w2), "-o", str(plan2),
               "--manifest", str(corpus.manifest))
        # the new plan refuses a fresh start; the parent's checkpoint resumes onto it
        res = runner.invoke(app, train_args(corpus, plan2, tmp_path / "fresh", "--nproc", str(w2)))
        assert res.exit_code == 2 and "re-planned at step" in res.output
        invoke(*train_args(corpus, plan2, ckpt, "--nproc", str(w2), "--trace", "--resume"))
        seen = Counter(i for t in traces(ckpt) for i in t["ids"])
        assert set(seen) == set(ids) and set(seen.values()) == {1}, w2
        log = read_jsonl(ckpt / "log.jsonl")
        n2 = json.loads((plan2 / "plan.json").read_text())["num_steps"]
        assert [x["step"] for x in log] == list(range(n2))  # steps continue from k on
