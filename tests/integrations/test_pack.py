"""``dataprep pack`` on a real corpus (mixed rates, stereo, WAV / FLAC / MP3 / AIFF, segments of a
long recording): each layout compiles back (container addressing, every row kept), trains two
steps over a plan of the packed copy, decodes to the same tensors as the loose files, loads in
Lhotse (``CutSet.from_shar``) and, where installed, NeMo; shards are atomic and resumable."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.integrations.pack import marker_folder, pack
from dataprep.training.audio import AudioReader, load_audio
from manifests.errors import DataprepError, OptionError
from manifests.manifest_read import read_manifest, read_metadata
from tests.training._consumer import Corpus, shared_corpus

runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"dataprep {' '.join(args)}\n{result.output}"
    return result.output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


def _sources(out: Path, layout: str, n: int) -> list[str]:
    if layout == "nemo-tarred":
        return [f"{out}/manifest__OP_0..{n - 1}_CL_.json", "--tarred-audio", f"{out}/audio__OP_0..{n - 1}_CL_.tar"]
    if layout == "shar":
        return [str(out)]
    return sorted(str(p) for p in out.glob("shard-*.tar"))


@pytest.fixture(scope="module", params=["nemo-tarred", "shar", "webdataset"])
def packed(request: pytest.FixtureRequest, corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(layout, compiled manifest of the packed copy)."""
    layout = request.param
    root = tmp_path_factory.mktemp(f"packed-{layout}")
    out = root / "packed"
    invoke("pack", str(corpus.manifest), "-o", str(out), "--layout", layout, "--num-parts", "3",
           "--buckets", str(corpus.buckets))
    manifest = root / "manifest.parquet"
    invoke("compile", *_sources(out, layout, 3), "--tokenizer", str(corpus.spm), "--probe", "always",
           "-o", str(manifest))
    return layout, manifest


def test_packed_copy_compiles_back_with_every_row(packed: tuple[str, Path], corpus: Corpus) -> None:
    _, manifest = packed
    src = read_manifest(corpus.manifest)
    got = read_manifest(manifest)
    rejects = pl.read_parquet(manifest.with_name("manifest.rejects.parquet"))
    assert rejects.height == 0, rejects.select("reason", "detail").to_dicts()
    assert got.height == src.height
    assert read_metadata(manifest)["schema_version"] == 2
    assert got["container"].null_count() == 0 and got["member_offset"].null_count() == 0
    assert sorted(got["text"].to_list()) == sorted(src["text"].to_list())
    # durations agree with the source within the probe tolerance, sorted per text
    a = src.sort("text", "duration")["duration"].to_numpy()
    b = got.sort("text", "duration")["duration"].to_numpy()
    assert np.abs(a - b).max() <= 0.05


def test_members_are_ordered_by_bucket(packed: tuple[str, Path]) -> None:
    _, manifest = packed
    got = read_manifest(manifest)
    # rows come shard by shard, members in tar order: durations of a shard follow its buckets
    by_shard = got.group_by("container", maintain_order=True).agg(pl.col("member_offset").is_sorted())
    assert by_shard["member_offset"].all()


def _source_ids(df: pl.DataFrame) -> pl.Series:
    """The compiled manifest's id each packed row came from (``source_id``, in ``custom`` for Shar)."""
    extra = pl.col("extra")
    ids = pl.coalesce(extra.str.json_path_match("$.source_id"), extra.str.json_path_match("$.custom.source_id"))
    return df.select(ids).to_series()


def test_container_audio_equals_the_loose_file(packed: tuple[str, Path], corpus: Corpus) -> None:
    _, manifest = packed
    src = read_manifest(corpus.manifest)
    got = read_manifest(manifest)
    got = got.with_columns(_source_ids(got).alias("source_id"))
    assert sorted(got["source_id"].to_list()) == sorted(src["id"].to_list())
    got = src.select("id").join(got, left_on="id", right_on="source_id", how="left", maintain_order="left",
                                suffix="_packed")
    reader = AudioReader()
    try:
        for a, b in zip(src.iter_rows(named=True), got.iter_rows(named=True)):
            loose = load_audio(a["id"], a["audio_path"], a["offset"], a["duration"])
            data = reader.member(b["id_packed"], b["container"], b["member_offset"], b["member_size"])
            inside = load_audio(b["id_packed"], b["audio_path"], b["offset"], b["duration"], data=data)
            n = min(len(loose), len(inside))
            assert abs(len(loose) - len(inside)) <= 1
            # whole files keep their bytes (identical samples); 16-bit segments are re-encoded losslessly
            assert np.array_equal(loose[:n], inside[:n]), (a["audio_path"], b["audio_path"])
    finally:
        reader.close()


def test_train_two_steps_over_a_plan_of_the_packed_copy(packed: tuple[str, Path], corpus: Corpus,
                                                        tmp_path: Path) -> None:
    _, manifest = packed
    buckets, plan = tmp_path / "buckets.json", tmp_path / "plan"
    invoke("fit-buckets", str(manifest), "-o", str(buckets), "--num-buckets", "2", "--num-subbuckets", "1",
           "--max-duration-budget", "8")
    invoke("plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", "1", "--seed", "0",
           "--epochs", "1", "-o", str(plan))
    out = invoke("train", str(plan), "--manifest", str(manifest), "--tokenizer", str(corpus.spm), "--model", "tiny",
                 "--steps", "2", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert "trained to step 2" in out


def test_shar_loads_in_lhotse(corpus: Corpus, tmp_path: Path) -> None:
    lhotse = pytest.importorskip("lhotse")
    out = tmp_path / "shar"
    pack(corpus.manifest, out, "shar", num_parts=2)
    src = read_manifest(corpus.manifest)
    cuts = list(lhotse.CutSet.from_shar(in_dir=out))
    assert len(cuts) == src.height
    assert sorted(c.supervisions[0].text for c in cuts) == sorted(src["text"].to_list())
    by_id = {r["id"]: r for r in src.iter_rows(named=True)}
    for cut in cuts[:8]:
        row = by_id[cut.custom["source_id"]]
        audio = cut.load_audio()
        assert abs(audio.shape[1] / cut.sampling_rate - row["duration"]) <= 0.05


def test_resumable_atomic_shards_and_refusals(corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "wds"
    first = pack(corpus.manifest, out, "webdataset", num_parts=3, part_index=1)
    assert first.written == [1] and sorted(p.name for p in out.glob("*.tar")) == ["shard-000001.tar"]
    rest = pack(corpus.manifest, out, "webdataset", num_parts=3)
    assert rest.written == [0, 2] and rest.skipped == [1]
    again = pack(corpus.manifest, out, "webdataset", num_parts=3)
    assert again.written == [] and again.skipped == [0, 1, 2]
    # a changed shard is redone; nothing temporary is left behind
    (out / "shard-000002.tar").write_bytes(b"damaged")
    assert pack(corpus.manifest, out, "webdataset", num_parts=3).written == [2]
    assert not list(out.glob(".*")) and len(list(marker_folder(out).glob("*.done.json"))) == 3
    keys = 0
    for t in out.glob("*.tar"):
        with tarfile.open(t) as tf:
            keys += len({m.split(".")[0] for m in tf.getnames()})
    assert keys == read_manifest(corpus.manifest).height
    with pytest.raises(DataprepError, match="written by a different run"):
        pack(corpus.manifest, out, "webdataset", num_parts=2)
    with pytest.raises(OptionError, match="^layout: must be nemo-tarred, shar or webdataset, got 'zip'"):
        pack(corpus.manifest, tmp_path / "x", "zip")
    with pytest.raises(OptionError, match="^container_size: must be >= 1, got 0"):
        pack(corpus.manifest, tmp_path / "x", "webdataset", container_size=0)
    res = CliRunner().invoke(app, ["pack", str(corpus.manifest), "-o", str(tmp_path / "y"), "--layout", "zip"])
    assert res.exit_code == 2 and res.output.strip() == "error: --layout: must be nemo-tarred, shar or webdataset, got 'zip'"


@pytest.mark.nemo
def test_nemo_tarred_loads_in_nemo(corpus: Corpus, tmp_path: Path) -> None:
    """NeMo's own tarred dataset reads the packed copy (skipped where NeMo is not installed)."""
    pytest.importorskip("nemo.collections.asr", reason="NeMo is not installed")
    from nemo.collections.asr.data.audio_to_text import TarredAudioToCharDataset

    out = tmp_path / "nemo"
    pack(corpus.manifest, out, "nemo-tarred", num_parts=2)
    manifests = ",".join(str(out / f"manifest_{i}.json") for i in range(2))
    ds = TarredAudioToCharDataset(audio_tar_filepaths=str(out / "audio__OP_0..1_CL_.tar"),
                                  manifest_filepath=manifests.split(","),  # per-shard manifests, as a list
                                  labels=list(" abcdefghijklmnopqrstuvwxyz'"), sample_rate=16000,
                                  shard_strategy="scatter", shuffle_n=0, global_rank=0, world_size=1)
    seen = sum(1 for _ in ds)
    lines = sum(len(Path(m).read_text().splitlines()) for m in manifests.split(","))
    assert seen == lines == read_manifest(corpus.manifest).height
    first = json.loads((out / "manifest_0.json").read_text().splitlines()[0])
    assert first["shard_id"] == 0


def test_packed_records_keep_every_field_the_export_writes(tmp_path_factory: pytest.TempPathFactory,
                                                           tmp_path: Path) -> None:
    """Pack writes its NeMo lines and Lhotse cuts with the export's writers (manifests.records): the
    languages, task, num_tokens and the source's other fields (pnc, speaker, ...) are all kept."""
    import gzip

    from manifests.records import custom_for_row, nemo_line
    from tests.integrations._rich import rich_corpus

    rich = rich_corpus(tmp_path_factory)
    by_id = {r["id"]: r for r in read_manifest(rich.manifest).iter_rows(named=True)}
    pack(rich.manifest, tmp_path / "nemo", "nemo-tarred", num_parts=2)
    lines = [json.loads(x) for p in sorted((tmp_path / "nemo").glob("manifest_*.json"))
             for x in p.read_text().splitlines()]
    assert sorted(x["source_id"] for x in lines) == sorted(by_id)
    for line in lines:
        want, _ = nemo_line(by_id[line["source_id"]])
        for k in ("audio_filepath", "offset", "duration", "sampling_rate"):
            want.pop(k, None)
        assert want.items() <= line.items() and "pnc" in line and "speaker" in line, line
        assert line.get("offset", 0.0) == 0.0  # a packed member is a whole file: no offset key (or 0)
    pack(rich.manifest, tmp_path / "shar", "shar", num_parts=2)
    cuts = [json.loads(x) for p in sorted((tmp_path / "shar").glob("cuts.*.jsonl.gz"))
            for x in gzip.decompress(p.read_bytes()).decode().splitlines()]
    assert sorted(c["custom"]["source_id"] for c in cuts) == sorted(by_id)
    for cut in cuts:
        row = by_id[cut["custom"]["source_id"]]
        assert custom_for_row(row).items() <= cut["custom"].items() and "num_tokens" in cut["custom"]
        assert cut["supervisions"][0]["text"] == row["text"]


def test_old_pack_flags_are_hidden_aliases_and_old_markers_are_read(corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "wds"
    text = invoke("pack", str(corpus.manifest), "-o", str(out), "--num-shards", "2", "--shard-index", "0",
                  "--shard-size", "1MB")
    assert "1 container written" in text and sorted(p.name for p in out.glob("*.tar")) == ["shard-000000.tar"]
    # the marker as the pack before the rename named and wrote it
    new = marker_folder(out) / "part-00000-of-00002.done.json"
    m = json.loads(new.read_text())
    m["shard_index"], m["num_shards"] = m.pop("part_index"), m.pop("num_parts")
    (marker_folder(out) / "shard-00000-of-00002.done.json").write_text(json.dumps(m))
    new.unlink()
    done = pack(corpus.manifest, out, "webdataset", num_parts=2)
    assert done.skipped == [0] and done.written == [1]
    help_text = invoke("pack", "--help")
    assert "--num-parts" in help_text and "--container-size" in help_text and "--shard-size" not in help_text
    res = runner.invoke(app, ["pack", str(corpus.manifest), "-o", str(out), "--num-parts", "2", "--num-shards", "2"])
    assert res.exit_code == 2 and "--num-shards is the old name of --num-parts" in res.output
