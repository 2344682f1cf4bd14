"""``dataprep compile`` end to end, as a user runs it, on real corpus metadata and real audio."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.compile import CompileOptions, compile_sources, compile_to_files
from dataprep.testing import write_nemo_manifest, write_tone
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest, read_metadata
from manifests.manifest_write import write_manifest, write_rejects
from tests.conftest import read_shared_csv, shared_file

runner = CliRunner()


def _nemo_from_csv(df: pl.DataFrame, path: Path) -> Path:
    rows = [{"audio_filepath": f"audio/{r['id']}.flac", "duration": r["duration"], "text": r["text"],
             "lang": r["lang"], "id_in_corpus": r["id"]} for r in df.iter_rows(named=True)]
    return write_nemo_manifest(path, rows)


def _compile(*args: str) -> None:
    res = runner.invoke(app, ["compile", *args])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def tiny_spm(tmp_path_factory) -> Path:
    from dataprep.testing import sample_corpus
    from dataprep.tokenize import train_model

    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    train_model(sample_corpus(2000)[1], path, vocab_size=200)
    return path


def test_shared_corpora_tokens_match_sentencepiece_and_bad_rows_are_kept(tmp_path, shared_spm_path) -> None:
    libri = read_shared_csv("librispeech.train-clean-100.csv").head(3000)
    cv = read_shared_csv("commonvoice.id_ps.csv").head(3000)
    src = _nemo_from_csv(pl.concat([libri, cv.select(libri.columns)]), tmp_path / "train.jsonl")
    good_lines = 6000
    with open(src, "ab") as fh:  # injected bad rows, one per problem
        fh.write(b'{"audio_filepath": "a.flac", "duration": 1.0, "text": "broken\n')
        fh.write(b'{"audio_filepath": "b.flac", "duration": "NaN", "text": "nan duration"}\n')
        fh.write(b'{"audio_filepath": "c.flac", "duration": 0, "text": "zero duration"}\n')
        fh.write(b'{"audio_filepath": "d.flac", "duration": 2.0, "text": ""}\n')
        fh.write(b'{"audio_filepath": "e.flac", "duration": 2.0, "text": "caf\xe9"}\n')
        fh.write(json.dumps({"audio_filepath": f"audio/{libri['id'][0]}.flac", "duration": 3.0,
                             "text": "duplicate"}).encode() + b"\n")
        fh.write(b'{"audio_filepath": "f.flac", "duration": -4.0, "text": "negative"}\n')
    out, rej = tmp_path / "m.parquet", tmp_path / "rej.parquet"
    _compile(str(src), "--tokenizer", str(shared_spm_path), "--prompt-tokens", "9", "-o", str(out),
             "--rejects", str(rej))
    m, r = read_manifest(out), read_manifest(rej, allow_rejects=True)
    assert m.height + r.height == good_lines + 7
    assert m.height == good_lines
    assert sorted(r["reason"].to_list()) == sorted(["malformed_line", "invalid_duration", "invalid_duration",
                                                    "empty_text", "non_utf8", "duplicate_id", "invalid_duration"])
    lines = [f"{src}:{good_lines + k}" for k in range(1, 8)]
    assert r["origin"].to_list() == lines  # input order, exact line numbers
    assert all(d.startswith(str(src)) and "\n" not in d for d in r["detail"])
    # independent token count: sentencepiece itself
    sp = spm.SentencePieceProcessor(model_file=str(shared_spm_path))
    expected = np.array([len(p) for p in sp.encode(m["text"].to_list())]) + 9
    assert np.array_equal(m["num_tokens"].to_numpy(), expected)
    np.testing.assert_allclose(m["tps"].to_numpy(), expected / m["duration"].to_numpy())
    assert m["duration"].to_list() == pl.concat([libri, cv.select(libri.columns)])["duration"].to_list()
    extra = json.loads(m["extra"][0])
    assert extra["id_in_corpus"] == libri["id"][0]  # nothing the user had is lost
    meta = read_metadata(out)
    assert meta["provenance"]["prompt_tokens"] == 9 and len(meta["content_hash"]) == 64


def test_durations_probed_from_real_audio_headers(tmp_path, tiny_spm) -> None:
    ref = pl.read_csv(shared_file("audio/manifest.csv"))
    rows = [{"audio_filepath": f, "text": t or "x"} for f, t in zip(ref["file"], ref["text"])]
    src = write_nemo_manifest(tmp_path / "audio.jsonl", rows)
    out = tmp_path / "m.parquet"
    _compile(str(src), "--tokenizer", str(tiny_spm), "--audio-root", str(shared_file("audio")), "-o", str(out))
    m = read_manifest(out)
    assert m.height == ref.height
    assert np.abs(m["duration"].to_numpy() - ref["duration"].to_numpy()).max() < 1e-3
    assert m["sample_rate"].to_list() == ref["sample_rate"].to_list()


def test_segments_probe_always_and_missing_audio(tmp_path, tiny_spm) -> None:
    write_tone(tmp_path / "audio" / "long.wav", 10.0)
    write_tone(tmp_path / "audio" / "short.flac", 2.0)
    (tmp_path / "audio" / "corrupt.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    rows = [
        {"audio_filepath": "audio/long.wav", "offset": 0.2, "duration": 4.0, "text": "one two"},
        {"audio_filepath": "audio/long.wav", "offset": 4.5, "text": "rest of the file"},
        {"audio_filepath": "audio/long.wav", "offset": 8.0, "duration": 5.0, "text": "past the end"},
        {"audio_filepath": "audio/short.flac", "duration": 1.5, "text": "wrong duration"},
        {"audio_filepath": "audio/gone.wav", "text": "missing"},
        {"audio_filepath": "audio/corrupt.wav", "text": "corrupt"},
    ]
    src = write_nemo_manifest(tmp_path / "seg.jsonl", rows)
    out, rej = tmp_path / "m.parquet", tmp_path / "r.parquet"
    _compile(str(src), "--tokenizer", str(tiny_spm), "--probe", "always", "-o", str(out), "--rejects", str(rej))
    m, r = read_manifest(out), read_manifest(rej, allow_rejects=True)
    assert m["duration"].to_list() == pytest.approx([4.0, 5.5])
    assert m["id"].to_list() == ["audio/long.wav#0.200", "audio/long.wav#4.500"]
    assert r["reason"].to_list() == ["segment_out_of_range", "duration_mismatch", "missing_audio", "unreadable_audio"]
    assert "gone.wav: audio file not found" in r["detail"][2]


def test_strict_stops_with_one_line_naming_file_and_line(tmp_path, tiny_spm) -> None:
    src = write_nemo_manifest(tmp_path / "s.jsonl", [{"audio_filepath": "a.wav", "duration": 1.0, "text": "ok"},
                                                     {"audio_filepath": "b.wav", "duration": 1.0, "text": ""}])
    res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(tiny_spm), "-o", str(tmp_path / "m.parquet"),
                              "--strict"])
    assert res.exit_code == 2
    assert f"{src}:2: empty text" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "m.parquet").exists()


def test_per_language_tokenizers_and_unknown_language(tmp_path, tiny_spm) -> None:
    src = write_nemo_manifest(tmp_path / "l.jsonl", [
        {"audio_filepath": "a.wav", "duration": 1.0, "text": "the people", "lang": "en"},
        {"audio_filepath": "b.wav", "duration": 1.0, "text": "guten tag", "source_lang": "en", "target_lang": "de"},
        {"audio_filepath": "c.wav", "duration": 1.0, "text": "bonjour", "lang": "fr"},
    ])
    out, rej = tmp_path / "m.parquet", tmp_path / "r.parquet"
    _compile(str(src), "--tokenizer", f"en={tiny_spm}", "--tokenizer", f"de={tiny_spm}", "-o", str(out),
             "--rejects", str(rej))
    assert read_manifest(out).height == 2
    r = read_manifest(rej, allow_rejects=True)
    assert r["reason"].to_list() == ["no_tokenizer"] and "language fr" in r["detail"][0]


def test_missing_tokenizer_file_is_clear(tmp_path) -> None:
    src = write_nemo_manifest(tmp_path / "x.jsonl", [{"audio_filepath": "a.wav", "duration": 1.0, "text": "hi"}])
    res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(tmp_path / "nope.model"), "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 2 and "nope.model: tokenizer model not found" in res.output


def test_train_tokenizer_cli(tmp_path) -> None:
    from dataprep.testing import sample_corpus

    rows = [{"audio_filepath": f"{i}.wav", "duration": 1.0, "text": t} for i, t in enumerate(sample_corpus(500)[1])]
    src = write_nemo_manifest(tmp_path / "t.jsonl", rows)
    res = runner.invoke(app, ["train-tokenizer", str(src), "--vocab-size", "100", "-o", str(tmp_path / "spm.model")])
    assert res.exit_code == 0, res.output
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    assert sp.get_piece_size() == 100


# --------------------------------------------------------------------------- streaming compile




def _in_memory_files(src: Path, spm: Path, opts: CompileOptions, folder: Path) -> tuple[Path, Path, str]:
    """The reference: the in-memory compile written by write_manifest / write_rejects."""
    ref = compile_sources([src], Tokenizers.from_specs([str(spm)]), opts)
    folder.mkdir(parents=True, exist_ok=True)
    h = write_manifest(ref.manifest, folder / "ref.parquet", ref.provenance)
    write_rejects(ref.rejects, folder / "ref.rejects.parquet", ref.provenance)
    return folder / "ref.parquet", folder / "ref.rejects.parquet", h


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.sampled_from([f"u{k}" for k in range(15)] + ["é", "a b"]), min_size=1, max_size=30),
       chunk_rows=st.integers(4, 12), bad=st.sets(st.integers(0, 29), max_size=5))
def test_streaming_compile_equals_the_in_memory_compile(ids, chunk_rows, bad, tiny_spm, tmp_path) -> None:
    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    rows = [{"audio_filepath": f"{i}.wav", "id": i, "duration": (-1.0 if k in bad else 1.0 + k / 10),
             "text": "the word " * (k % 4 + 1), "lang": None if k % 5 else "en"} for k, i in enumerate(ids)]
    src = write_nemo_manifest(run / "s.jsonl", rows)
    opts = CompileOptions(prompt_tokens=2, chunk_rows=chunk_rows)
    ref_m, ref_r, ref_h = _in_memory_files(src, tiny_spm, opts, run / "ref")
    out, rej = run / "out" / "m.parquet", run / "out" / "r.parquet"
    got = compile_to_files([src], Tokenizers.from_specs([str(tiny_spm)]), opts, out, rej)
    assert out.read_bytes() == ref_m.read_bytes() and rej.read_bytes() == ref_r.read_bytes()
    assert got.content_hash == ref_h
    m, r = read_manifest(out), read_manifest(rej, allow_rejects=True)
    assert got.rows_in == len(ids) == m.height + r.height and got.rows_kept == m.height
    assert got.hours == pytest.approx(float(m["duration"].sum() or 0.0) / 3600)
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.parquet", "r.parquet"]  # spool removed
    good = [(k, i) for k, i in enumerate(ids) if k not in bad]
    firsts = [i for n, (k, i) in enumerate(good) if i not in [j for _, j in good[:n]]]
    assert m["id"].to_list() == [f"{i}.wav" for i in firsts]  # first good copy of each id (ids from the path)


def test_streaming_compile_strict_duplicate_and_cleanup(tmp_path, tiny_spm) -> None:
    rows = [{"audio_filepath": f"{k % 3}.wav", "duration": 1.0, "text": "one"} for k in range(7)]
    src = write_nemo_manifest(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out" / "m.parquet"
    opts = CompileOptions(chunk_rows=2, strict=True)
    with pytest.raises(DataprepError, match=r"d.jsonl:4: duplicate id 0.wav \(first at [^ ]*d.jsonl:1\)"):
        compile_to_files([src], Tokenizers.from_specs([str(tiny_spm)]), opts, out, tmp_path / "out" / "r.parquet")
    assert list((tmp_path / "out").iterdir()) == []  # no output, no spool left behind


def test_cli_compile_reports_counts_and_hours(tmp_path, tiny_spm) -> None:
    rows = [{"audio_filepath": f"{k % 4}.wav", "duration": 900.0, "text": "one two"} for k in range(6)]
    src = write_nemo_manifest(tmp_path / "h.jsonl", rows)
    res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(tiny_spm), "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 0, res.output
    assert "4 (1.00 h)" in res.output and "duplicate_id" in res.output
    r = read_manifest(tmp_path / "m.rejects.parquet", allow_rejects=True)
    assert r["reason"].to_list() == ["duplicate_id"] * 2
    assert r["detail"].to_list() == [f"{src}:{k}: duplicate id {k - 5}.wav (first at {src}:{k - 4})" for k in (5, 6)]
