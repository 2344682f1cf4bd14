"""``dataprep train --prefetch-steps`` on a Shar pack held in the loopback S3
(:mod:`tests.integrations.test_prefetch_s3`'s ``in_store``): the ranks train the same batches,
tensors included, as over the local copy, each step's audio read ahead from the store."""

from __future__ import annotations

import json
from pathlib import Path

from dataprep.cli import app
from manifests.column_cache import ColumnCache
from manifests.plan_files import PlanShard
from tests.integrations.test_prefetch import corpus, expected_requests_of_step, planned  # noqa: F401  (fixtures)
from tests.integrations.test_prefetch_s3 import in_store  # noqa: F401  (fixture)
from tests.training._consumer import Corpus, invoke, runner


def train(c: Corpus, plan: Path, manifest: Path, ckpt: Path, *extra: str) -> list[list[dict]]:
    invoke("train", str(plan), "--manifest", str(manifest), "--tokenizer", str(c.spm), "--checkpoint-dir", str(ckpt),
           "--timeout", "90", "--quiet", "--nproc", "2", "--steps", "2", "--trace", *extra)
    traces = [[json.loads(x) for x in (ckpt / f"trace-rank-{r:05d}.jsonl").read_text().splitlines()] for r in range(2)]
    return [[{k: v for k, v in t.items() if k in ("step", "ids", "sha256", "bucket")} for t in tr] for tr in traces]


def test_train_with_prefetch_from_a_store(in_store: tuple[Path, Path, Path, Path], s3: object, corpus: Corpus,
                                          tmp_path: Path) -> None:
    local_m, local_plan, url_m, url_plan = in_store
    got = train(corpus, url_plan, url_m, tmp_path / "s3", "--prefetch-steps", "2", "--prefetch-bytes", str(1 << 20))
    columns = ColumnCache.open(url_m)  # one GET per coalesced range of steps 0 and 1 on each rank: read ahead
    want = [q for r in range(2) for pb in PlanShard(url_plan, r).iter_batches(0) if pb.step < 2
            for q in expected_requests_of_step(columns, pb)]
    assert s3.counts()["GET"] == len(want)  # type: ignore[attr-defined]
    assert got == train(corpus, local_plan, local_m, tmp_path / "local")
    assert [t["step"] for t in got[0]] == [0, 1]


def test_bad_prefetch_flags_are_one_line(in_store: tuple[Path, Path, Path, Path], corpus: Corpus, tmp_path: Path) -> None:
    _, _, url_m, url_plan = in_store
    res = runner.invoke(app, ["train", str(url_plan), "--manifest", str(url_m), "--tokenizer", str(corpus.spm),
                              "--checkpoint-dir", str(tmp_path), "--prefetch-steps", "2", "--prefetch-bytes", "0"])
    assert res.exit_code != 0 and "--prefetch-bytes" in res.output and "Traceback" not in res.output
