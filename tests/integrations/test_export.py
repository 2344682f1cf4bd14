"""``dataprep export nemo|lhotse``: files NeMo reads, and a round trip through the real Lhotse sampler."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from dataprep.cli import app
from dataprep.integrations.export import export_lhotse, export_nemo, lhotse_constraint, load_inputs
from manifests.buckets_file import read_buckets
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest
from tests.integrations._rich import Rich, rich_corpus
from tests.training._consumer import Corpus, invoke, runner, shared_corpus

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
        if rows.height:  # a whole file's line has no offset (an explicit one makes a segment)
            rows = rows.with_columns((pl.col("offset") if "offset" in rows.columns else pl.lit(None, pl.Float64))
                                     .fill_null(0.0).alias("offset"))
        total += rows.height
        if rows.height:
            assert rows["duration"].max() <= d
            joined = rows.join(df.select(pl.col("audio_path").alias("audio_filepath"), "offset", "num_tokens"),
                               on=["audio_filepath", "offset"])
            assert joined.height == rows.height and joined["num_tokens"].max() <= t
    assert total == df.height == pl.read_ndjson(tmp_path / "a" / "manifest.jsonl").height
    # NeMo's config path needs the manifest (IncompleteConfigError without it): absolute, as NeMo reads it
    assert cfg["manifest_filepath"] == str((tmp_path / "a").resolve() / "manifest.jsonl")
    first = {name: (tmp_path / "a" / name).read_bytes() for name in ("bucketing.yaml", "manifest.jsonl", "bucket-000.jsonl")}
    said = invoke("export", "nemo", str(plan), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "a"))
    assert said.split("bucketing.yaml, ")[1].strip() == "manifest.jsonl, bucket-*.jsonl"  # what it wrote
    for name, data in first.items():  # equal inputs, equal bytes
        assert (tmp_path / "a" / name).read_bytes() == data


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


# --------------------------------------------------------------------------- exports that lose nothing


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


def test_nemo_export_round_trips_every_field(rich: Rich, tmp_path: Path) -> None:
    invoke("export", "nemo", str(rich.plan), "--manifest", str(rich.manifest), "-o", str(tmp_path / "nemo"))
    lines = [json.loads(x) for x in (tmp_path / "nemo" / "manifest.jsonl").read_text().splitlines()]
    assert all("pnc" in x and "speaker" in x and x["taskname"] == "asr" for x in lines)  # extra back at top level
    again = tmp_path / "again.parquet"
    invoke("compile", str(tmp_path / "nemo" / "manifest.jsonl"), "--tokenizer", str(rich.spm), "-o", str(again),
           "--probe", "always", "--prompt-format", "canary2")
    a, b = read_manifest(rich.manifest), read_manifest(again)
    assert a.height == b.height == len(lines)
    b = b.join(a.select("id"), on="id", how="semi")
    assert b.height == a.height  # same ids (derived from the same paths and offsets)
    a, b = a.sort("id"), b.sort("id")
    same = ["id", "audio_path", "offset", "duration", "sample_rate", "channels", "text", "lang", "source_lang",
            "target_lang", "task", "num_tokens", "tps"]
    assert a.select(same).equals(b.select(same))
    for ea, eb, sr, off, ch in zip(a["extra"], b["extra"], a["sample_rate"], a["offset"], a["channels"]):
        eb = json.loads(eb)
        written = eb.pop("sampling_rate", None)
        assert json.loads(ea) == eb
        assert written == (sr if off == 0 and ch == 1 else None)


def test_nemo_export_max_tps_keeps_every_row_and_selects_a_channel(rich: Rich, tmp_path: Path) -> None:
    import soundfile

    cfg = export_nemo(rich.plan, rich.manifest, tmp_path / "n")
    assert cfg["channel_selector"] == 0  # stereo audio present
    for x in map(json.loads, (tmp_path / "n" / "manifest.jsonl").read_text().splitlines()):
        d, offset = x["duration"], x.get("offset", 0.0)  # a whole file's line has no offset
        if "sampling_rate" not in x:  # NeMo reads the header and Lhotse's truncate clips to it
            d = min(d, soundfile.info(x["audio_filepath"]).duration - offset)
        row = read_manifest(rich.manifest).filter(pl.col("audio_path") == x["audio_filepath"],
                                                  pl.col("offset") == offset)
        assert row["num_tokens"][0] / d <= cfg["max_tps"]
    assert export_nemo(rich.plan, rich.manifest, tmp_path / "n1", channel=1)["channel_selector"] == 1


def test_lhotse_export_cuts_are_valid_and_lose_nothing(rich: Rich, tmp_path: Path) -> None:
    from lhotse import CutSet, MultiCut, fix_manifests, validate

    bins = export_lhotse(rich.plan, rich.manifest, tmp_path / "l")
    cuts = CutSet.from_jsonl(tmp_path / "l" / "cuts.jsonl.gz").to_eager()
    df = read_manifest(rich.manifest)
    assert len(cuts) == bins["num_cuts"] == df.height
    validate(cuts, read_data=False)
    recordings, supervisions, _ = cuts.decompose()
    _, fixed_s = fix_manifests(recordings, supervisions)
    assert len(fixed_s) == len(supervisions) and all(
        a.start == b.start and a.duration == b.duration for a, b in zip(fixed_s, supervisions))
    by_id = {r["id"]: r for r in df.iter_rows(named=True)}
    for cut in cuts:
        row = by_id[cut.id]
        assert cut.start == row["offset"] and cut.duration == row["duration"]
        assert cut.supervisions[0].start == 0 and cut.supervisions[0].text == row["text"]
        assert isinstance(cut, MultiCut) == (row["channels"] > 1) and cut.num_channels == row["channels"]
        assert {k: cut.custom[k] for k in json.loads(row["extra"])} == json.loads(row["extra"])
        assert cut.custom["source_lang"] == row["source_lang"] and cut.custom["num_tokens"] == row["num_tokens"]
        assert cut.sampling_rate == row["sample_rate"]
    mono = export_lhotse(rich.plan, rich.manifest, tmp_path / "m", channel=0)
    assert mono["num_cuts"] == df.height
    assert all(type(c).__name__ == "MonoCut" for c in CutSet.from_jsonl(tmp_path / "m" / "cuts.jsonl.gz"))


def test_uncovered_rows_are_an_error_or_rejects(rich: Rich, tmp_path: Path) -> None:
    df = read_manifest(rich.manifest)
    cut_at = float(np.sort(df["duration"].to_numpy())[-3])  # the longest rows fit no bucket
    n_out = int((df["duration"] > cut_at).sum())
    assert n_out >= 1
    spec = {"version": 1, "buckets": [{"index": 0, "max_duration": cut_at, "batch_size": 4}]}
    buckets = tmp_path / "short.json"
    buckets.write_text(json.dumps(spec))
    res = runner.invoke(app, ["export", "nemo", str(buckets), "--manifest", str(rich.manifest), "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and f"{n_out} row(s) are in no bucket" in res.output and not (tmp_path / "x").exists()
    invoke("export", "lhotse", str(buckets), "--manifest", str(rich.manifest), "-o", str(tmp_path / "y"),
           "--rejects", str(tmp_path / "rej.parquet"))
    rej = pl.read_parquet(tmp_path / "rej.parquet")
    assert rej.height == n_out and set(rej["reason"]) == {"exceeds_bucket"} and (rej["duration"] > cut_at).all()
    assert json.loads((tmp_path / "y" / "bins.json").read_text())["num_cuts"] == df.height - n_out


def test_export_replaces_the_folder_whole(rich: Rich, tmp_path: Path) -> None:
    out = tmp_path / "e"
    export_nemo(rich.plan, rich.manifest, out)
    (out / "bucket-099.jsonl").write_text("stale\n")
    export_nemo(rich.buckets, rich.manifest, out)
    assert not (out / "bucket-099.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(DataprepError, match="not an export folder"):
        export_lhotse(rich.plan, rich.manifest, other)
    assert (other / "notes.txt").read_text() == "keep me"


def _lhotse_cut(row: dict, channel: int | None, custom: dict) -> Any:
    """The cut built with Lhotse's own classes (an independent reference for the cut dicts)."""
    from lhotse import AudioSource, MonoCut, MultiCut, Recording, SupervisionSegment
    from lhotse.utils import compute_num_samples

    import soundfile

    if float(row["offset"] or 0) == 0 and row["sample_rate"] and row["channels"]:
        sr, ch, dur = int(row["sample_rate"]), int(row["channels"]), float(row["duration"])
        n = compute_num_samples(dur, sr)
    else:
        info = soundfile.info(row["audio_path"])
        sr, ch, n, dur = info.samplerate, info.channels, info.frames, info.frames / info.samplerate
    ids = list(range(ch))
    rec = Recording(id=row["audio_path"], sources=[AudioSource(type="file", channels=ids, source=row["audio_path"])],
                    sampling_rate=sr, num_samples=n, duration=math.ceil(dur * 1e8) / 1e8, channel_ids=ids)
    c = (0 if ch == 1 else ids) if channel is None else channel
    sup = SupervisionSegment(id=row["id"], recording_id=rec.id, start=0.0, duration=row["duration"], channel=c,
                             text=row["text"], language=row["lang"])
    want = {k: row[k] for k in ("source_lang", "target_lang") if row[k] is not None}
    want |= {"taskname": row["task"]} if row["task"] is not None else {}
    want |= json.loads(row["extra"]) if row["extra"] else {}
    want |= {"num_tokens": row["num_tokens"]} if row["num_tokens"] is not None else {}
    return (MultiCut if isinstance(c, list) else MonoCut)(
        id=row["id"], start=float(row["offset"] or 0), duration=row["duration"], channel=c, recording=rec,
        supervisions=[sup], custom={**want, **custom})


def test_cut_dicts_equal_lhotse_to_dict(rich: Rich) -> None:
    """The one cut writer (manifests.records.cut_dict) gives Lhotse's own ``to_dict`` on every kind
    of row, and the cut the samplers get is that dict loaded by Lhotse."""
    from dataprep.integrations.cuts import cut_dict_for_row, cut_for_row

    rows = read_manifest(rich.manifest).to_dicts()
    for channel in (None, 0):
        for row in rows:
            want = _lhotse_cut(row, channel, {"bucket": 1}).to_dict()
            got = cut_dict_for_row(row, channel, {"bucket": 1})
            assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
            assert cut_for_row(row, channel, {"bucket": 1}).to_dict() == want
