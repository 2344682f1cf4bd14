"""``dataprep train`` with real torch.distributed (gloo, 2 and 4 local ranks) over a real plan.

Every run has a timeout: a hung rank fails the test with a message instead of hanging it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep.planning.calibrate import MIN_ROWS, calibrate
from dataprep.testing import write_tone
from manifests.manifest_read import read_manifest
from tests.training._consumer import Corpus, build_corpus, invoke, runner
from dataprep.cli import app

TIMEOUT = "90"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("ddp-corpus"), num_tones=20, shared_limit=6)


def train_args(c: Corpus, plan: Path, ckpt: Path, *extra: str) -> list[str]:
    return ["train", str(plan), "--manifest", str(c.manifest), "--tokenizer", str(c.spm), "--checkpoint-dir",
            str(ckpt), "--cache-dir", str(c.root / "cache"), "--timeout", TIMEOUT, "--quiet", *extra]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


@pytest.mark.parametrize("world_size,epochs,balance", [(2, 2, "0"), (4, 1, None)])
def test_ranks_step_together_and_see_each_utterance_once_per_epoch(corpus: Corpus, tmp_path: Path, world_size: int,
                                                                   epochs: int, balance: str | None) -> None:
    plan = corpus.plan(world_size, epochs=epochs, balance=balance)
    meta = json.loads((plan / "plan.json").read_text())
    invoke(*train_args(corpus, plan, tmp_path, "--nproc", str(world_size), "--trace"))
    traces = [read_jsonl(tmp_path / f"trace-rank-{r:05d}.jsonl") for r in range(world_size)]
    steps = [[t["step"] for t in tr] for tr in traces]
    assert all(s == list(range(meta["num_steps"])) for s in steps)  # same steps on every rank
    for r, tr in enumerate(traces):  # every rank trains its own shard's batches, in order
        shard = pq.read_table(plan / f"rank-{r:05d}.parquet", columns=["bucket", "ids"])
        assert [t["bucket"] for t in tr] == shard.column("bucket").to_pylist()
        assert [t["ids"] for t in tr] == shard.column("ids").to_pylist()
    one_bucket = [len({r["bucket"] for r in rows}) == 1 for rows in zip(*traces)]
    if balance == "0":
        assert all(one_bucket) and "balance" not in meta  # one bucket per step on all ranks
    else:  # the default: balanced steps; the same-bucket share the plan reports is what trained
        assert meta["balance"]["tolerance"] == 0.05
        assert meta["balance"]["same_bucket"] == pytest.approx(sum(one_bucket) / len(one_bucket))
    ids = read_manifest(corpus.manifest)["id"].to_list()
    for e in range(epochs):
        seen = Counter(i for tr in traces for t in tr if t["epoch"] == e for i in t["ids"])
        assert set(seen) == set(ids) and set(seen.values()) == {1}
    log = read_jsonl(tmp_path / "log.jsonl")
    assert [x["step"] for x in log] == list(range(meta["num_steps"]))
    for x in log:
        assert math.isfinite(x["loss"]) and 0 <= x["padding_audio"] < 1 and 0 <= x["padding_tokens"] < 1
        assert x["utterances"] >= world_size and x["utt_per_s"] > 0
    for r in range(world_size):  # each rank's step times: what `dataprep calibrate` fits
        times = pq.read_table(tmp_path / f"steps-rank-{r:05d}.parquet").to_pylist()
        assert [t["step"] for t in times] == list(range(meta["num_steps"])) and {t["rank"] for t in times} == {r}
        assert all(t["forward_backward_s"] > 0 and t["optimizer_s"] > 0 and t["data_wait_s"] >= 0
                   and t["grad_sync_s"] >= 0 for t in times)
    if world_size * meta["num_steps"] >= MIN_ROWS:
        cal = calibrate(plan, tmp_path)  # the checkpoint folder's step logs
        assert cal.rows == world_size * meta["num_steps"] and len(cal.rank_speed) == world_size


def test_resume_continues_at_the_exact_next_batch(corpus: Corpus, tmp_path: Path) -> None:
    plan = corpus.plan(2, epochs=2)
    n = json.loads((plan / "plan.json").read_text())["num_steps"]
    k = n // 2 + 1
    full, part = tmp_path / "full", tmp_path / "part"
    invoke(*train_args(corpus, plan, full, "--nproc", "2", "--trace"))
    invoke(*train_args(corpus, plan, part, "--nproc", "2", "--trace", "--steps", str(k)))
    first = read_jsonl(part / "trace-rank-00000.jsonl")
    assert [t["step"] for t in first] == list(range(k))
    invoke(*train_args(corpus, plan, part, "--nproc", "2", "--trace", "--resume"))
    for r in range(2):  # same ids and same tensors (SHA-256) at every step
        assert read_jsonl(part / f"trace-rank-{r:05d}.jsonl") == read_jsonl(full / f"trace-rank-{r:05d}.jsonl")
    a, b = read_jsonl(full / "log.jsonl"), read_jsonl(part / "log.jsonl")
    assert [x["step"] for x in b] == list(range(n))
    # model, optimizer and dropout seeds restored: the resumed run computes the same losses
    assert [x["loss"] for x in b[k:]] == pytest.approx([x["loss"] for x in a[k:]], rel=1e-4)
    steps = pq.read_table(part / "steps-rank-00001.parquet", columns=["step"]).column("step").to_pylist()
    assert steps == list(range(n))  # the step log kept the first run's steps and added the rest


def test_the_plans_end_is_a_clean_stop_whatever_steps_says(corpus: Corpus, tmp_path: Path) -> None:
    """``--steps`` past the plan trains to its end and exits 0 saying so; ``--resume`` of a run at
    the end trains nothing and says the same; ``--steps`` short of it says so too."""
    plan = corpus.plan(1)
    n = json.loads((plan / "plan.json").read_text())["num_steps"]
    ckpt = tmp_path / "run"
    short = invoke(*train_args(corpus, plan, ckpt, "--steps", "2"))
    assert f"trained to step 2 (--steps 2; the plan goes on to step {n}: --resume continues)" in short
    for extra in (("--resume", "--steps", str(n + 1000)), ("--resume",)):
        res = runner.invoke(app, train_args(corpus, plan, ckpt, *extra))
        assert res.exit_code == 0, res.output
        assert res.output.splitlines()[-1] == (f"trained to step {n}: the plan's end (plan.json num_steps {n}); "
                                               f"checkpoint -> {ckpt / 'last.pt'}")
    assert [x["step"] for x in read_jsonl(ckpt / "log.jsonl")] == list(range(n))


def test_world_size_must_match_the_plan(corpus: Corpus, tmp_path: Path) -> None:
    res = runner.invoke(app, train_args(corpus, corpus.plan(2), tmp_path, "--nproc", "3"))
    assert res.exit_code == 2
    assert "world size 2" in res.output and "3 process" in res.output


def test_bad_audio_at_training_time(tmp_path: Path) -> None:
    c = build_corpus(tmp_path / "c", num_tones=16, shared_limit=0)
    plan = c.plan(2)
    assert json.loads((plan / "plan.json").read_text())["fallbacks"]["dropped_rows"] == 0
    df = read_manifest(c.manifest)
    whole = df.filter(df["offset"].fill_null(0) == 0)
    gone_id, gone = whole["id"][0], Path(whole["audio_path"][0])
    bad_id, bad = whole["id"][1], Path(whole["audio_path"][1])
    gone.unlink()
    bad.write_bytes(b"RIFF" + bytes(200))
    res = runner.invoke(app, train_args(c, plan, tmp_path / "strict", "--nproc", "2"))
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("error: utterance")
    assert (gone_id in line and str(gone) in line) or (bad_id in line and str(bad) in line)
    invoke(*train_args(c, plan, tmp_path / "skip", "--nproc", "2", "--skip-bad-audio"))
    # read ahead too (--prefetch-steps): a missing file is left to the decoder, which skips it
    invoke(*train_args(c, plan, tmp_path / "skip-ahead", "--nproc", "2", "--skip-bad-audio", "--prefetch-steps", "2"))
    for run in ("skip", "skip-ahead"):
        logs = [tmp_path / run / f"skipped-rank-{r:05d}.jsonl" for r in range(2)]
        skipped = [s for p in logs if p.exists() for s in read_jsonl(p)]
        assert sorted(s["id"] for s in skipped) == sorted([gone_id, bad_id])
        assert {s["audio_path"] for s in skipped} == {str(gone), str(bad)}
    write_tone(gone, 1.0)  # keep the fixture's files whole for anyone after us


def test_train_features_flag_picks_the_front_end(corpus: Corpus, tmp_path: Path) -> None:
    """``--features nemo`` trains 2 steps on NeMo's front end (other tensors than ours, same
    batches); an unknown name is one line naming the flag."""
    plan = corpus.plan(2)
    traces = {}
    for name in ("ours", "nemo"):
        invoke(*train_args(corpus, plan, tmp_path / name, "--nproc", "2", "--trace", "--steps", "2",
                           "--features", name))
        traces[name] = read_jsonl(tmp_path / name / "trace-rank-00000.jsonl")
        assert [t["step"] for t in traces[name]] == [0, 1]
    assert [t["ids"] for t in traces["ours"]] == [t["ids"] for t in traces["nemo"]]
    assert traces["ours"] != traces["nemo"]
    res = runner.invoke(app, train_args(corpus, plan, tmp_path / "bad", "--nproc", "2", "--features", "kaldi"))
    assert res.exit_code == 2 and res.output.startswith("error: --features: must be ours, nemo or canary-1b")
