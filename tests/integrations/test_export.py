"""``dataprep export nemo|lhotse``: files NeMo reads, and a round trip through the real Lhotse sampler."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dataprep.integrations.export import lhotse_constraint, load_inputs
from manifests.buckets_file import read_buckets
from manifests.io import read_manifest
from tests.training._consumer import Corpus, invoke, shared_corpus

lhotse = pytest.importorskip("lhotse", reason="lhotse (dev extra) is needed for the round trip")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


def test_export_nemo_from_a_plan(corpus: Corpus, tmp_path: Path) -> None:
    plan = corpus.plan(1)
    invoke("export", "nemo", str(plan), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "a"))
    cfg = json.loads((tmp_path / "a" / "bucketing.yaml").read_text())
    spec = read_buckets(corpus.buckets)
    assert cfg["num_buckets"] == len(spec.buckets)
    assert cfg["bucket_batch_size"] == [b.batch_size for b in spec.buckets]
    bins = cfg["bucket_duration_bins"]
    assert [d for d, _ in bins] == [b.max_duration for b in spec.buckets]
    assert all(t >= b.max_tokens for (_, t), b in zip(bins, spec.buckets))
    df = read_manifest(corpus.manifest)
    assert cfg["max_tps"] >= df["tps"].max()
    # per-bucket manifests: every utterance once, inside its bucket's bounds
    total = 0
    for b, (d, t) in enumerate(bins):
        rows = pl.read_ndjson(tmp_path / "a" / f"bucket-{b:03d}.jsonl")
        total += rows.height
        if rows.height:
            assert rows["duration"].max() <= d
            joined = rows.join(df.select(pl.col("audio_path").alias("audio_filepath"), "offset", "num_tokens"),
                               on=["audio_filepath", "offset"])
            assert joined.height == rows.height and joined["num_tokens"].max() <= t
    assert total == df.height == pl.read_ndjson(tmp_path / "a" / "manifest.jsonl").height
    invoke("export", "nemo", str(plan), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "b"))
    for name in ("bucketing.yaml", "manifest.jsonl", "bucket-000.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("source", ["buckets", "plan"])
def test_lhotse_round_trip_same_buckets(corpus: Corpus, tmp_path: Path, source: str) -> None:
    from lhotse import CutSet
    from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler

    # Lhotse puts each cut in the smallest bucket that holds it; a plan that carried bucket
    # tails on (the default) moved some rows further, which Lhotse's bins cannot express.
    src = corpus.buckets if source == "buckets" else corpus.plan(1, carry=False)
    invoke("export", "lhotse", str(src), "--manifest", str(corpus.manifest), "-o", str(tmp_path))
    bins = json.loads((tmp_path / "bins.json").read_text())
    cuts = CutSet.from_jsonl(tmp_path / "cuts.jsonl.gz").to_eager()
    ours = load_inputs(src, corpus.manifest)
    assert len(cuts) == int((ours.bucket >= 0).sum())
    constraint = lhotse_constraint(bins["duration_bins"], bins["bucket_batch_size"])
    by_id = dict(zip(ours.manifest["id"].to_list(), ours.bucket.tolist()))
    for cut in cuts:  # lhotse's bucket choice for each cut = ours
        assert constraint.select_bucket(constraint.max_seq_len_buckets, cut) == by_id[cut.id] == cut.custom["bucket"]
    sampler = DynamicBucketingSampler(cuts, constraint=constraint,
                                      duration_bins=[tuple(b) for b in bins["duration_bins"]],
                                      buffer_size=len(cuts) + 1, shuffle=True, seed=0, drop_last=False)
    seen = []
    for batch in sampler:
        buckets = {by_id[c.id] for c in batch}
        assert len(buckets) == 1
        assert len(batch) <= bins["bucket_batch_size"][buckets.pop()]
        seen += [c.id for c in batch]
    assert sorted(seen) == sorted(c.id for c in cuts)
    # audio of an exported cut decodes through lhotse to the segment we load
    cut = next(c for c in cuts if c.start > 0)
    audio = cut.load_audio()
    assert abs(audio.shape[-1] - cut.duration * cut.sampling_rate) <= 1


def test_lhotse_1d_bins_use_lhotse_constraint(corpus: Corpus, tmp_path: Path) -> None:
    from lhotse.dataset.sampling.dynamic_bucketing import FixedBucketBatchSizeConstraint

    spec = json.loads(corpus.buckets.read_text())
    durations = sorted({b["max_duration"] for b in spec["buckets"]})
    one_d = {"version": 1, "buckets": [{"index": i, "max_duration": d, "batch_size": 2}
                                       for i, d in enumerate(durations)]}
    path = tmp_path / "buckets-1d.json"
    path.write_text(json.dumps(one_d))
    invoke("export", "lhotse", str(path), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "out"))
    bins = json.loads((tmp_path / "out" / "bins.json").read_text())
    assert bins["duration_bins"] == durations
    c = lhotse_constraint(bins["duration_bins"], bins["bucket_batch_size"])
    assert type(c) is FixedBucketBatchSizeConstraint
    d = read_manifest(corpus.manifest)["duration"].to_numpy()
    expected = np.searchsorted(np.asarray(durations), d, side="left")
    got = [c.select_bucket(durations, example_len=x) for x in d]
    assert got == expected.tolist()
