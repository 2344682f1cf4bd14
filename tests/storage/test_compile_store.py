"""`dataprep compile` over the loopback S3, as a user runs it: a manifest, its audio, tarred
shards and Shar folders in the store, outputs written to it; headers probed by range reads and
cached by ETag; store faults retried, or one line."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import write_tone
from dataprep.testing_store import LoopbackS3, Rule
from manifests import storage, store_facts

runner = CliRunner()
SECONDS = [1.0, 1.5, 2.25, 0.75]


def _put(s3: LoopbackS3, key: str, data: bytes) -> str:
    s3.client().put_object(Bucket=s3.bucket[5:], Key=key, Body=data)
    return f"{s3.bucket}/{key}"


def _wavs(tmp: Path) -> list[bytes]:
    return [write_tone(tmp / f"a{i}.wav", s, seed=i).read_bytes() for i, s in enumerate(SECONDS)]


def _lines(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def _read(url: str) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(storage.read_bytes(url)))


@pytest.fixture()
def corpus(s3: LoopbackS3, tmp_path: Path) -> str:
    """``s3://<bucket>/data/train.jsonl``: four clips with relative audio paths and no durations,
    one row naming an absent object, one line broken."""
    for i, data in enumerate(_wavs(tmp_path)):
        _put(s3, f"data/audio/a{i}.wav", data)
    rows = [{"audio_filepath": f"audio/a{i}.wav", "text": f"clip number {i}"} for i in range(4)]
    rows.append({"audio_filepath": "audio/absent.wav", "text": "no such clip"})
    return _put(s3, "data/train.jsonl", _lines(rows) + b'{"audio_filepath": "x.wav", "text": \n')


def test_compile_from_and_to_the_store(corpus: str, s3: LoopbackS3, tiny_spm: str) -> None:
    out = f"{s3.bucket}/compiled/train.parquet"
    spm = _put(s3, "models/spm.model", Path(tiny_spm).read_bytes())
    text = _run("compile", corpus, "--tokenizer", f"en={spm}", "--tokenizer", spm, "-o", out)
    assert f"manifest -> {out}" in text and f"rejects  -> {s3.bucket}/compiled/train.rejects.parquet" in text
    kept = _read(out)
    assert kept["duration"].to_list() == pytest.approx(SECONDS)
    assert kept["audio_path"].to_list() == [f"{s3.bucket}/data/audio/a{i}.wav" for i in range(4)]
    rejects = _read(f"{s3.bucket}/compiled/train.rejects.parquet")
    assert sorted(rejects["reason"].to_list()) == ["malformed_line", "missing_audio"]  # nothing lost
    assert all(d.startswith(corpus) or d.startswith(s3.bucket) for d in rejects["detail"].to_list())
    assert "testing" not in storage.read_bytes(out).decode("latin-1")  # no credential in the output


def test_headers_are_range_reads_and_a_rerun_reads_no_audio(corpus: str, s3: LoopbackS3, tiny_spm: str,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "cache"))
    storage.reset_clients()
    out = str(tmp_path / "m.parquet")
    s3.reset_counts()
    _run("compile", corpus, "--tokenizer", tiny_spm, "-o", out)
    first = s3.counts()
    assert first["GET"] <= 2 + len(SECONDS), first  # the manifest, then one range read per clip's header
    s3.reset_counts()
    storage.reset_clients()
    _run("compile", corpus, "--tokenizer", tiny_spm, "-o", out)
    again = s3.counts()
    assert again["GET"] <= 1, again  # a listing of the audio folder; the manifest's copy and the headers cached


def test_a_store_fault_during_compile_is_retried_and_the_result_is_the_same(corpus: str, s3: LoopbackS3,
                                                                          tiny_spm: str, tmp_path: Path) -> None:
    _run("compile", corpus, "--tokenizer", tiny_spm, "-o", str(tmp_path / "clean.parquet"))
    storage.reset_clients()
    with s3.faults(Rule("503", times=3), Rule("truncate", method="GET", path=r"\.wav", times=2),
                   Rule("reset", method="GET", times=1)):
        _run("compile", corpus, "--tokenizer", tiny_spm, "-o", str(tmp_path / "faulty.parquet"), "--probe", "always")
    clean = pl.read_parquet(tmp_path / "clean.parquet")
    faulty = pl.read_parquet(tmp_path / "faulty.parquet")
    assert faulty.select("id", "duration").equals(clean.select("id", "duration"))


def test_a_store_that_keeps_failing_is_one_line_and_no_output(corpus: str, s3: LoopbackS3, tiny_spm: str,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "cache"))  # no header cached: each must be read
    out = f"{s3.bucket}/compiled/never.parquet"
    storage.reset_clients()
    with s3.faults(Rule("503", method="GET", path=r"\.wav", times=None)):
        res = runner.invoke(app, ["compile", corpus, "--tokenizer", tiny_spm, "-o", out])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: s3://") and "503 SlowDown (gave up after 4 attempts)" in lines[-1]
    assert "Traceback" not in res.output
    assert not storage.exists(out) and not storage.exists(out.replace(".parquet", ".rejects.parquet"))


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_input_cfg_with_nemo_tarred_shards_in_the_store(s3: LoopbackS3, tiny_spm: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "cache"))
    wavs = _wavs(tmp_path)
    for shard in (0, 1):
        _put(s3, f"tarred/audio_{shard}.tar", _tar({f"s{shard}_{i}.wav": wavs[i] for i in range(2)}))
        _put(s3, f"tarred/manifest_{shard}.json", _lines(
            [{"audio_filepath": f"s{shard}_{i}.wav", "text": f"shard {shard} clip {i}", "shard_id": shard}
             for i in range(2)]))
    cfg = tmp_path / "blend.yaml"
    cfg.write_text(f"""- type: nemo_tarred
  manifest_filepath: {s3.bucket}/tarred/manifest_{{0..1}}.json
  tarred_audio_filepaths: {s3.bucket}/tarred/audio_{{0..1}}.tar
  weight: 1.0
""")
    out = tmp_path / "m.parquet"
    _run("compile", str(cfg), "--tokenizer", tiny_spm, "-o", str(out))
    kept = pl.read_parquet(out)
    assert kept.height == 4
    assert kept["container"].to_list() == [f"{s3.bucket}/tarred/audio_{s}.tar" for s in (0, 0, 1, 1)]
    assert kept["duration"].to_list() == pytest.approx(SECONDS[:2] * 2)
    s3.reset_counts()
    storage.reset_clients()
    _run("compile", str(cfg), "--tokenizer", tiny_spm, "-o", str(out))
    assert s3.counts()["GET"] <= 4, s3.counts()  # tar indexes and member headers cached by ETag
    tar0 = storage.read_bytes(f"{s3.bucket}/tarred/audio_0.tar")
    row = kept.row(1, named=True)
    assert tar0[row["member_offset"]:row["member_offset"] + row["member_size"]] == wavs[1]


def test_a_shar_folder_in_the_store(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    wavs = _wavs(tmp_path)
    cuts = [{"id": f"c{i}", "start": 0, "duration": SECONDS[i], "channel": 0,
             "supervisions": [{"id": f"c{i}", "recording_id": f"c{i}", "start": 0, "duration": SECONDS[i],
                               "channel": 0, "text": f"cut {i}"}],
             "recording": {"id": f"c{i}", "sources": [{"type": "shar", "channels": [0], "source": ""}],
                           "sampling_rate": 16000, "num_samples": int(SECONDS[i] * 16000),
                           "duration": SECONDS[i]},
             "type": "MonoCut"} for i in range(3)]
    _put(s3, "shar/cuts.000000.jsonl", _lines(cuts))
    _put(s3, "shar/recording.000000.tar", _tar({f"c{i}.wav": wavs[i] for i in range(3)}))
    out = tmp_path / "m.parquet"
    _run("compile", f"{s3.bucket}/shar", "--tokenizer", tiny_spm, "-o", str(out))
    kept = pl.read_parquet(out)
    assert kept["id"].to_list() == ["c0", "c1", "c2"]
    assert set(kept["container"].to_list()) == {f"{s3.bucket}/shar/recording.000000.tar"}


def test_unsupported_remote_schemes_are_refused_in_one_line(tmp_path: Path, tiny_spm: str) -> None:
    cfg = tmp_path / "blend.yaml"
    cfg.write_text("- type: nemo\n  manifest_filepath: ais://bucket/x.json\n  weight: 1.0\n")
    res = runner.invoke(app, ["compile", str(cfg), "--tokenizer", tiny_spm, "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 2 and "only s3://, gs:// and az:// URLs are read" in res.output


def test_store_audio_not_probed_is_checked_for_existence(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    """A local manifest with s3:// audio and durations (--probe auto reads no header): the summary
    says how many of the sampled objects are absent, asked of the store (not taken as local paths)."""
    _put(s3, "loose/a.wav", _wavs(tmp_path)[0])
    src = tmp_path / "m.jsonl"
    src.write_bytes(_lines([{"audio_filepath": f"{s3.bucket}/loose/a.wav", "duration": 1.0, "text": "here"},
                            {"audio_filepath": f"{s3.bucket}/loose/gone.wav", "duration": 1.0, "text": "gone"}]))
    text = _run("compile", str(src), "--tokenizer", tiny_spm, "-o", str(tmp_path / "m.parquet"))
    assert f"audio missing: 1 of 2 sampled files do not exist (e.g. {s3.bucket}/loose/gone.wav)" in " ".join(text.split())


def test_header_probes_of_a_store_run_in_parallel(s3: LoopbackS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """soundfile's read callbacks run one at a time: a header read inside them would serialise
    the probe threads (8 probes, 0.25 s a request: 2 s one after another)."""
    from dataprep.compile.probe import probe_headers
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "cache"))
    storage.reset_clients()
    data = _wavs(tmp_path)[0]
    urls = [_put(s3, f"par/a{i}.wav", data) for i in range(8)]
    store_facts.infos(urls)
    s3.state.latency_s = 0.25
    try:
        t = time.perf_counter()
        got = probe_headers(urls, threads=8)
        took = time.perf_counter() - t
    finally:
        s3.state.latency_s = 0.0
    assert got["file_duration"].to_list() == pytest.approx([SECONDS[0]] * 8)
    assert took < 1.2, took


def test_a_folder_of_many_objects_is_listed_in_ranges_at_once(s3: LoopbackS3, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Many members (a sample spread over a large folder, or all of it): the folder is listed in
    key ranges split at the members' quantiles, concurrently: every object found with its size, a missing one None, a subfolder's
    objects never taken for the folder's, and the same answer as one listing."""
    folder = tmp_path / "many"
    (folder / "sub").mkdir(parents=True)
    for i in range(60):
        (folder / f"k{i:03d}.bin").write_bytes(b"x" * i)
    (folder / "sub" / "k010.bin").write_bytes(b"deeper")
    s3.load(f"{s3.bucket}/many", folder)
    wanted = [f"{s3.bucket}/many/k{i:03d}.bin" for i in range(0, 64, 2)]  # 60..62: absent
    monkeypatch.setattr(store_facts, "RANGE_MEMBERS", 8)  # 32 members: 4 ranges
    s3.reset_counts()
    got = store_facts.infos(wanted)
    assert s3.counts()["GET"] >= 4
    assert {u: (i.size if i else None) for u, i in got.items()} == {
        u: (int(u[-7:-4]) if int(u[-7:-4]) < 60 else None) for u in wanted}
    monkeypatch.setattr(store_facts, "RANGE_MEMBERS", 64)  # one listing
    assert {u: i.size if i else None for u, i in store_facts.infos(wanted).items()} == \
        {u: i.size if i else None for u, i in got.items()}
