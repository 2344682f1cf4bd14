"""Packed corpora all the way to the consumers (issue 20), on the rich real-audio corpus (mono and
stereo WAV / FLAC at 8-44.1 kHz, segments of long recordings, ``pnc`` / ``decodercontext`` /
languages): every field survives pack + compile in each layout with the same token counts;
``PlanSampler`` replays a plan of the packed copy with the loose files' samples, reading members
lazily; exports of container manifests open in Lhotse and name NeMo's tarred patterns; pack never
writes where its inputs live and rejects audio changed since compile; a loader asked past the
plan's end stops with one line."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dataprep.integrations.cuts import cut_for_row
from dataprep.integrations.lhotse import PlanDataLoader, PlanEnded, PlanSampler
from manifests.plan_cursor import PlanStateError
from dataprep.integrations.pack import pack, rejects_path
from manifests.audio import AudioReader
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest
from manifests.plan_files import open_shard
from tests.integrations._rich import Rich, rich_corpus
from tests.training._consumer import invoke

LAYOUTS = ("nemo-tarred", "shar", "webdataset")
FIELDS = ("text", "lang", "source_lang", "target_lang", "task", "num_tokens")


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


def compile_packed(rich: Rich, out: Path, layout: str, n: int, manifest: Path) -> Path:
    sources = {"nemo-tarred": [f"{out}/manifest__OP_0..{n - 1}_CL_.json", "--tarred-audio",
                               f"{out}/audio__OP_0..{n - 1}_CL_.tar"],
               "shar": [str(out)], "webdataset": sorted(str(p) for p in out.glob("shard-*.tar"))}[layout]
    invoke("compile", *sources, "--tokenizer", str(rich.spm), "--probe", "always", "--prompt-format", "canary2",
           "-o", str(manifest))
    return manifest


@pytest.fixture(scope="module", params=LAYOUTS)
def packed(request: pytest.FixtureRequest, rich: Rich, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(layout, compiled manifest of the packed copy, a 2-rank plan of it)."""
    layout = request.param
    root = tmp_path_factory.mktemp(f"consumers-{layout}")
    invoke("pack", str(rich.manifest), "-o", str(root / "packed"), "--layout", layout, "--num-parts", "2",
           "--buckets", str(rich.buckets))
    manifest = compile_packed(rich, root / "packed", layout, 2, root / "m.parquet")
    plan = root / "plan"
    invoke("plan-batches", str(manifest), "--buckets", str(rich.buckets), "--world-size", "2", "--seed", "0",
           "-o", str(plan))
    return layout, manifest, plan


def by_source(manifest: Path) -> dict[str, dict[str, object]]:
    """Rows of a packed copy's manifest by their ``source_id``."""
    return {json.loads(r["extra"])["source_id"]: r for r in read_manifest(manifest).to_dicts()}


def test_every_field_survives_pack_and_compile(packed: tuple[str, Path, Path], rich: Rich) -> None:
    _, manifest, _ = packed
    src = read_manifest(rich.manifest)
    got = by_source(manifest)
    assert len(got) == src.height
    assert pl.read_parquet(manifest.with_name("m.rejects.parquet")).height == 0
    for row in src.to_dicts():
        p = got[row["id"]]
        assert {f: p[f] for f in FIELDS} == {f: row[f] for f in FIELDS}, row["id"]
        extra = {k: v for k, v in json.loads(p["extra"]).items() if k not in ("source_id", "shard_id", "sampling_rate")}
        assert extra == json.loads(row["extra"]), row["id"]  # pnc, decodercontext, speaker
        assert abs(p["duration"] - row["duration"]) <= 0.05 and p["channels"] == row["channels"]
    assert sum(json.loads(r["extra"])["pnc"] == "no" for r in got.values()) > 0
    assert sum("decodercontext" in json.loads(r["extra"]) for r in got.values()) > 0


def test_a_repack_keeps_every_field_and_the_first_source_id(packed: tuple[str, Path, Path], rich: Rich,
                                                            tmp_path: Path) -> None:
    layout, manifest, _ = packed
    if layout != "shar":
        pytest.skip("one layout is enough: the writers are shared")
    pack(manifest, tmp_path / "again", "webdataset", num_parts=1)
    again = by_source(compile_packed(rich, tmp_path / "again", "webdataset", 1, tmp_path / "again.parquet"))
    first = by_source(manifest)
    assert again.keys() == first.keys() == set(read_manifest(rich.manifest)["id"])
    for sid, row in first.items():
        assert {f: again[sid][f] for f in FIELDS} == {f: row[f] for f in FIELDS}
        assert json.loads(again[sid]["extra"]) == json.loads(row["extra"])


def test_plan_sampler_replays_the_packed_copy_with_the_loose_samples(packed: tuple[str, Path, Path],
                                                                      rich: Rich) -> None:
    _, manifest, plan = packed
    loose = {r["id"]: r for r in read_manifest(rich.manifest).to_dicts()}
    source_of = {r["id"]: json.loads(r["extra"])["source_id"] for r in read_manifest(manifest).to_dicts()}
    reader = AudioReader()
    for rank in range(2):
        sampler = PlanSampler(plan, manifest, rank=rank, world_size=2)
        sampler = pickle.loads(pickle.dumps(sampler))  # as a DataLoader worker gets it
        got = []
        for cuts in sampler:
            got.append([c.id for c in cuts])
            for cut in cuts:
                src = source_of[cut.id]
                ref = reader.samples(loose[src], channel="all")
                audio = cut.load_audio()  # channels x frames, read from the member's byte range
                assert audio.shape[0] == ref.shape[1] and abs(audio.shape[1] - ref.shape[0]) <= 2, src
                k = min(audio.shape[1], ref.shape[0])
                np.testing.assert_allclose(audio[:, :k].T, ref[:k], atol=1e-4)
        assert got == [b.ids for b in open_shard(plan, rank)]


def test_container_cut_is_lazy_and_channel_picks_one(packed: tuple[str, Path, Path]) -> None:
    _, manifest, _ = packed
    row = next(r for r in read_manifest(manifest).to_dicts() if r["channels"] == 2)
    cut = cut_for_row(row, channel=1)
    src = cut.recording.sources[0]
    assert src.type == "container" and isinstance(src.source, str)  # an address, no bytes held
    both = cut_for_row(row).load_audio()
    np.testing.assert_array_equal(cut.load_audio()[0], both[1])
    assert src.to_dict()["type"] == "command"  # what an export writes


def test_export_lhotse_of_a_packed_copy_round_trips_through_lhotse_and_compile(
        packed: tuple[str, Path, Path], rich: Rich, tmp_path: Path) -> None:
    """Tar members export as a Lhotse Shar set: Lhotse's ``CutSet.from_shar`` reads every cut with
    its bucket and audio, and our ``compile`` reads the same folder back into the same rows."""
    from lhotse import CutSet

    from dataprep.integrations.export import export_lhotse

    _, manifest, plan = packed
    out = tmp_path / "lhotse"
    said = invoke("export", "lhotse", str(plan), "-m", str(manifest), "-o", str(out))
    assert "(shar/cuts.*.jsonl.gz, shar/recording.*.tar)" in said and not (out / "cuts.jsonl.gz").exists()
    cuts = CutSet.from_shar(in_dir=out / "shar")
    rows = {r["id"]: r for r in read_manifest(manifest).to_dicts()}
    n = 0
    for cut in cuts:
        live = cut_for_row(rows[cut.id]).load_audio()
        np.testing.assert_allclose(cut.load_audio(), live, atol=1e-4)
        assert isinstance(cut.custom["bucket"], int)
        n += 1
    assert n == len(rows)
    back = tmp_path / "back.parquet"
    invoke("compile", str(out / "shar"), "--tokenizer", str(rich.spm), "-o", str(back), "--prompt-format", "canary2")
    again = read_manifest(back)
    assert sorted(again["id"]) == sorted(rows)
    assert sorted(zip(again["id"], again["text"], again["num_tokens"])) == sorted(
        (r["id"], r["text"], r["num_tokens"]) for r in rows.values())
    assert export_lhotse(plan, manifest, tmp_path / "again")["num_cuts"] == n


def test_export_nemo_of_a_packed_copy(packed: tuple[str, Path, Path], tmp_path: Path) -> None:
    from dataprep.integrations.export import export_nemo

    layout, manifest, plan = packed
    if layout != "nemo-tarred":
        with pytest.raises(DataprepError, match="dataprep pack .* --layout nemo-tarred"):
            export_nemo(plan, manifest, tmp_path / "nemo")
        assert not (tmp_path / "nemo").exists()
        return
    cfg = export_nemo(plan, manifest, tmp_path / "nemo")
    assert cfg["tarred_audio_filepaths"].endswith("audio__OP_0..1_CL_.tar") and cfg["is_tarred"]
    assert cfg["manifest_filepath"] == str((tmp_path / "nemo").resolve() / "manifest__OP_0..1_CL_.json")
    lines = [json.loads(x) for k in range(2) for x in (tmp_path / "nemo" / f"manifest_{k}.json").read_text().splitlines()]
    src = read_manifest(manifest)
    assert len(lines) == src.height
    assert {(x["audio_filepath"], x["shard_id"]) for x in lines} == {
        (r["audio_path"].split(":", 1)[1].rsplit(":", 1)[-1], int(Path(r["container"]).stem.split("_")[1]))
        for r in src.to_dicts()}
    assert {x["pnc"] for x in lines} == {"yes", "no"} and any("decodercontext" in x for x in lines)


def test_pack_refuses_an_output_where_its_inputs_live(rich: Rich, tmp_path: Path) -> None:
    audio_dir = rich.root / "audio"
    before = {p.name: p.read_bytes() for p in audio_dir.iterdir()}
    link = tmp_path / "link-to-audio"
    link.symlink_to(audio_dir)
    for out in (audio_dir, rich.root, link):
        with pytest.raises(DataprepError, match="refusing to write where the inputs live"):
            pack(rich.manifest, out, "nemo-tarred", num_parts=1)
    assert {p.name: p.read_bytes() for p in audio_dir.iterdir()} == before
    assert not (rich.root / ".audio.pack").exists() and not (tmp_path / ".link-to-audio.pack").exists()


def test_pack_into_a_packed_corpus_folder_is_refused_and_it_stays_byte_identical(rich: Rich, tmp_path: Path) -> None:
    """The issue's case: a filtered manifest of a NeMo tarred corpus packed into its own folder."""
    out = tmp_path / "corpus"
    pack(rich.manifest, out, "nemo-tarred", num_parts=2)
    manifest = compile_packed(rich, out, "nemo-tarred", 2, tmp_path / "m.parquet")
    filtered = tmp_path / "filtered.parquet"
    invoke("filter", str(manifest), "-o", str(filtered), "--max-duration", "2.0")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = subprocess.run([sys.executable, "-m", "dataprep.cli", "pack", str(filtered), "-o", str(out),
                             "--layout", "nemo-tarred", "--num-parts", "2"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "refusing to write where the inputs live" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_audio_changed_since_compile_is_rejected_not_packed(rich: Rich, tmp_path: Path) -> None:
    import soundfile

    root = tmp_path / "copy"
    shutil.copytree(rich.root / "audio", root / "audio")
    df = read_manifest(rich.manifest)
    moved = df.with_columns(pl.col("audio_path").str.replace(str(rich.root / "audio"), str(root / "audio"),
                                                             literal=True))
    manifest = tmp_path / "moved.parquet"
    from manifests.manifest_write import write_manifest

    write_manifest(moved, manifest)
    victim = next(r for r in moved.to_dicts() if float(r["offset"] or 0) == 0 and r["duration"] > 1.0
                  and r["audio_path"].startswith(str(root)))
    soundfile.write(victim["audio_path"], np.zeros(int(0.3 * victim["sample_rate"]) * victim["channels"],
                                                   dtype=np.float32).reshape(-1, victim["channels"]),
                    victim["sample_rate"])
    out = tmp_path / "packed"
    summary = pack(manifest, out, "shar", num_parts=2)
    rejects = pl.read_parquet(rejects_path(out))
    assert rejects["reason"].to_list() == ["audio_changed"] * rejects.height
    assert victim["id"] in rejects["id"].to_list()
    assert summary.rows + summary.rejected == df.height and summary.rejected == rejects.height
    back = compile_packed(rich, out, "shar", 2, tmp_path / "back.parquet")
    assert victim["id"] not in by_source(back)
    assert len(by_source(back)) == df.height - rejects.height


def test_a_loader_asked_past_the_plan_ends_the_run(rich: Rich, capsys: pytest.CaptureFixture[str]) -> None:
    """The plan is one pass: ``len()`` stays the pass's; another ``iter()`` raises PlanEnded (a
    StopIteration: Lightning's fit loop returns) and rank 0 prints one line; a loader restored
    at the end yields nothing on its first pass (Lightning asks for it outside its loop)."""
    class Identity:
        def __getitem__(self, cuts: object) -> object:
            return cuts

    n = len(list(open_shard(rich.plan, 0)))
    loader = PlanDataLoader(Identity(), PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2))
    assert len(loader) == n and len(list(loader)) == n
    assert len(loader) == n  # the pass's length, fixed through it
    capsys.readouterr()
    with pytest.raises(PlanEnded) as info:
        iter(loader)  # raised by iter() itself, before any batch is asked for
    assert isinstance(info.value, StopIteration)
    num_steps = json.loads((rich.plan / "plan.json").read_text())["num_steps"]
    line = f"{rich.plan}: the plan's end: rank 0 trained every batch up to step {num_steps} (plan.json num_steps {num_steps}); stopping the run"
    assert str(info.value) == line and capsys.readouterr().err == line + "\n"
    state = loader.state_dict()
    assert (state["next_step"], state["pass_start"]) == (num_steps, 0)
    again = PlanDataLoader(Identity(), PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2))
    for bad in ("0", 1.0, -1, num_steps + 1):  # refused in one line, changing nothing
        with pytest.raises(PlanStateError, match="pass_start"):
            again.load_state_dict({**state, "pass_start": bad})
        assert again.state_dict()["next_step"] == 0
    again.load_state_dict(state)
    capsys.readouterr()
    assert len(again) == n and list(again) == []
    with pytest.raises(PlanEnded):
        iter(again)
    assert capsys.readouterr().err == line + "\n"  # one line for the two calls
    other = PlanDataLoader(Identity(), PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2))
    other.load_state_dict(state)
    capsys.readouterr()
    assert list(other) == [] and capsys.readouterr().err == ""  # one line: rank 0's
