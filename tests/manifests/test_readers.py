"""Source readers on real files written in tmp_path (and ../shared/data CSVs when present)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifests.errors import DataprepError
from manifests.readers import SOURCE_FORMATS, detect_format, iter_source
from manifests.schema import REJECTS_POLARS_SCHEMA
from tests.conftest import SHARED_DATA as SHARED
from tests.conftest import SLOW_EXAMPLES

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} absent (shared corpus metadata)")


def read_all(path, fmt="auto", **kw) -> pl.DataFrame:
    frames = list(iter_source(path, fmt, **kw))
    for f in frames:
        assert f.schema == pl.Schema(REJECTS_POLARS_SCHEMA)
        assert f.height > 0
    return pl.concat(frames) if frames else pl.DataFrame(schema=REJECTS_POLARS_SCHEMA)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- NeMo -----------------------------------------------------------------------------------

def test_nemo_round_trip_fields_ids_and_extra(tmp_path: Path) -> None:
    rows = [
        {"audio_filepath": "a.wav", "duration": 1.25, "text": "hello", "lang": "en", "pnc": "yes"},
        {"audio_filepath": "sub/b.flac", "duration": 3, "offset": 12.5, "answer": "hallo", "text": "hello",
         "source_lang": "en", "target_lang": "de", "taskname": "ast", "z": [1, 2], "b": {"k": 1}},
        {"audio_filepath": "/abs/c.wav", "duration": "2.5", "text": "numeric string duration"},
    ]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    df = read_all(src)
    assert df["id"].to_list() == ["a.wav", "sub/b.flac#12.500", "/abs/c.wav"]
    assert df["audio_path"].to_list() == [str(tmp_path / "a.wav"), str(tmp_path / "sub/b.flac"), "/abs/c.wav"]
    assert df["offset"].to_list() == [None, 12.5, None]  # no offset: the whole file
    assert df["duration"].to_list() == [1.25, 3.0, 2.5]
    assert df["text"].to_list() == ["hello", "hello", "numeric string duration"]
    assert df["lang"].to_list() == ["en", "de", None]  # lang, else target_lang, else source_lang
    assert df["task"].to_list() == [None, "ast", None]
    assert df["origin"].to_list() == [f"{src}:1", f"{src}:2", f"{src}:3"]
    assert df["reason"].null_count() == 3
    extras = [None if e is None else json.loads(e) for e in df["extra"]]
    assert extras == [{"pnc": "yes"}, {"answer": "hallo", "b": {"k": 1}, "z": [1, 2]}, None]
    assert list(json.loads(df["extra"][1])) == sorted(json.loads(df["extra"][1]))
    assert df["num_tokens"].null_count() == df["tps"].null_count() == 3
    # --text-field answer: AST manifests train on the translation.
    ast = read_all(src, text_field="answer")
    assert ast["text"][1] == "hallo"
    assert ast["reason"].to_list() == ["missing_field", None, "missing_field"]
    assert ast["detail"][0] == f"{src}:1: missing field 'answer'"


def test_id_derivation_matches_python_formatting(tmp_path: Path) -> None:
    offsets = [0.0, 1.0005, 0.0625, 7.25, 1234.56789, 1e-4]
    src = write_jsonl(tmp_path / "m.jsonl", [{"audio_filepath": "x.wav", "offset": o, "text": "t"} for o in offsets])
    got = read_all(src)["id"].to_list()
    assert got == [f"x.wav#{o:.3f}" for o in offsets]


def test_explicit_offset_zero_is_a_segment_of_its_own(tmp_path: Path) -> None:
    """As NeMo: a line with an explicit offset (0 included) is a segment, distinct from the whole
    file's line; a line without one (or with a null one) is the whole file."""
    rows = [{"audio_filepath": "x.wav", "text": "whole"}, {"audio_filepath": "x.wav", "offset": 0, "duration": 1.5,
                                                           "text": "segment"},
            {"audio_filepath": "y.wav", "offset": None, "text": "whole too"}]
    src = write_jsonl(tmp_path / "m.jsonl", rows)
    assert read_all(src)["offset"].to_list() == [None, 0.0, None]  # the segment keeps its 0
    assert read_all(src)["id"].to_list() == ["x.wav", "x.wav#0.000", "y.wav"]


def test_audio_root_and_relative_paths(tmp_path: Path) -> None:
    sub = tmp_path / "manifests"
    sub.mkdir()
    src = write_jsonl(sub / "m.jsonl", [{"audio_filepath": "./a/x.wav", "text": "t"},
                                        {"audio_filepath": "s3://bucket/y.wav", "text": "t"}])
    assert read_all(src)["audio_path"].to_list() == [str(sub / "a/x.wav"), "s3://bucket/y.wav"]
    root = tmp_path / "audio"
    assert read_all(src, audio_root=root)["audio_path"][0] == str(root / "a/x.wav")
    # The id keeps the path as written.
    assert read_all(src, audio_root=root)["id"][0] == "./a/x.wav"


def test_bad_lines_become_rejects_with_origin(tmp_path: Path) -> None:
    good = json.dumps({"audio_filepath": "g.wav", "duration": 1.0, "text": "good"})
    lines = [
        b"\xef\xbb\xbf" + good.encode(),                              # 1 BOM
        b'{"audio_filepath": "a.wav", "duration": 1.0 "text": "x"}',  # 2 malformed
        b"",                                                          # 3 blank: skipped
        b'{"audio_filepath": "b.wav", "text": "caf\xe9"}',            # 4 latin-1 byte
        b'{"duration": 1.0, "text": "no audio"}',                     # 5 missing audio
        b'{"audio_filepath": "c.wav", "duration": "abc", "text": "x"}',  # 6 wrong type
        b'{"audio_filepath": "d.wav", "duration": [1], "text": "x"}',    # 7 wrong type
        b'{"audio_filepath": "e.wav", "text": 5}',                    # 8 text not a string
        b'["not", "an", "object"]',                                   # 9
        b'{"audio_filepath": "f.wav"}',                               # 10 no text
        good.encode(),                                                # 11, no final newline
    ]
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b"\r\n".join(lines))
    df = read_all(src, chunk_rows=4)
    assert df.height == 10
    assert df["origin"].to_list() == [f"{src}:{i}" for i in (1, 2, 4, 5, 6, 7, 8, 9, 10, 11)]
    assert df["reason"].to_list() == [None, "malformed_line", "non_utf8", "missing_field", "malformed_line",
                                      "malformed_line", "malformed_line", "malformed_line", "missing_field", None]
    d = dict(zip(df["origin"].str.split(":").list.last().cast(int), df["detail"]))
    assert d[2] == f"{src}:2: malformed JSON (Expecting ',' delimiter at column 45)"
    assert d[4].startswith(f"{src}:4: invalid UTF-8 byte 0xe9")
    assert d[5] == f"{src}:5: missing field 'audio_filepath'"
    assert d[6] == f"{src}:6: field 'duration' is not a number ('abc')"
    assert d[7] == f"{src}:7: field 'duration' is not a number (got ARRAY)"
    assert "'text' is not a string" in d[8] and "JSON object" in d[9]
    good_rows = df.filter(pl.col("reason").is_null())
    assert good_rows["text"].to_list() == ["good", "good"] and good_rows["duration"].to_list() == [1.0, 1.0]


def test_gzip_nemo_and_empty_file(tmp_path: Path) -> None:
    rows = [{"audio_filepath": f"{i}.wav", "duration": i + 0.5, "text": f"t{i}"} for i in range(5)]
    gz = tmp_path / "m.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    assert detect_format(gz) == "nemo"
    assert read_all(gz)["duration"].to_list() == [i + 0.5 for i in range(5)]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert read_all(empty, "nemo").height == 0


_GOOD = st.builds(lambda d, t: json.dumps({"audio_filepath": "a.wav", "duration": d, "text": t}),
                  st.floats(0.1, 100), st.text(min_size=1, max_size=12))
_BAD = st.sampled_from(['{"audio_filepath": ', '{"text": "x"}', '{"audio_filepath": "x", "duration": "zz", "text": "q"}',
                        "\udcff", "[]", '{"audio_filepath": 3, "text": "q"}', "   "])


@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(_GOOD, _BAD), min_size=1, max_size=40), chunk=st.integers(1, 7),
       crlf=st.booleans())
def test_chunking_never_changes_rows(tmp_path_factory, lines: list[str], chunk: int, crlf: bool) -> None:
    src = tmp_path_factory.mktemp("h") / "m.jsonl"
    sep = b"\r\n" if crlf else b"\n"
    src.write_bytes(sep.join(l.encode("utf-8", "surrogateescape") for l in lines))
    small = read_all(src, "nemo", chunk_rows=chunk)
    big = read_all(src, "nemo", chunk_rows=10_000)
    assert small.equals(big)
    nonblank = [i + 1 for i, l in enumerate(lines) if l.strip()]
    assert small.height == len(nonblank)  # rows in == rows out
    assert small["origin"].to_list() == [f"{src}:{i}" for i in nonblank]
    assert small.filter(pl.col("reason").is_null())["duration"].null_count() == 0


def test_block_boundaries_do_not_split_lines(tmp_path: Path) -> None:
    from manifests.readers._lines import iter_lines

    src = tmp_path / "m.txt"
    src.write_bytes("\n".join(f"line é {i}" for i in range(1000)).encode())
    frames = list(iter_lines(src, chunk_rows=33, block_bytes=37))
    df = pl.concat(frames)
    assert df["line"].to_list() == [f"line é {i}" for i in range(1000)]
    assert df["lineno"].to_list() == list(range(1, 1001))


# --- Lhotse ---------------------------------------------------------------------------------

def test_lhotse_cuts_written_by_lhotse(tmp_path: Path) -> None:
    lhotse = pytest.importorskip("lhotse")
    from lhotse import CutSet, Recording, SupervisionSegment

    wav = tmp_path / "rec.wav"
    sf.write(wav, np.zeros(16000 * 4, dtype=np.float32), 16000)
    rec = Recording.from_file(wav)
    cut = rec.to_cut().truncate(offset=1.0, duration=2.0)
    cut.supervisions = [
        SupervisionSegment(id="s2", recording_id=rec.id, start=1.0, duration=0.5, text="world", language="en"),
        SupervisionSegment(id="s1", recording_id=rec.id, start=0.0, duration=0.5, text="hello", language="fr"),
    ]
    cut2 = rec.to_cut()
    cut2.supervisions = []
    path = tmp_path / "cuts.jsonl.gz"
    CutSet.from_cuts([cut, cut2]).to_file(path)
    assert detect_format(path) == "lhotse"
    df = read_all(path)
    assert df["id"].to_list() == [cut.id, cut2.id]
    assert df["audio_path"][0] == str(wav.resolve())
    assert df["offset"].to_list() == [1.0, 0.0]
    assert df["duration"].to_list() == [2.0, 4.0]
    assert df["sample_rate"].to_list() == [16000, 16000] and df["channels"].to_list() == [1, 1]
    assert df["text"][0] == "hello world" and df["lang"][0] == "fr"
    assert df["reason"].to_list() == [None, "missing_field"]
    assert lhotse is not None


# --- Kaldi ----------------------------------------------------------------------------------

def test_kaldi_dir_with_segments_and_bad_lines(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    (d / "wav.scp").write_text("r1 /a/r1.wav\nr2 sox r2.flac -t wav - |\nr3 rel/r3.wav\n")
    (d / "segments").write_text("u1 r1 0.5 2.0\nu2 r2 0 1\nu3 r3 1.0\nu4 r9 0 1\nu5 r1 3 4\nu6 r3 0 2\n")
    (d / "text").write_text("u1 HELLO WORLD\nu2 PIPED\n\nu3 BAD SEGMENT\nu4 NO RECORDING\nu6\n")
    (d / "utt2lang").write_text("u1 en\n")
    (d / "utt2spk").write_text("u1 spk1\n")
    assert detect_format(d) == "kaldi"
    df = read_all(d)
    text = d / "text"
    assert df["origin"].to_list() == [f"{text}:{i}" for i in (1, 2, 4, 5, 6)] + [f"{d / 'segments'}:5"]
    assert df["id"].to_list() == ["u1", "u2", "u3", "u4", "u6", "u5"]
    assert df["reason"].to_list() == [None, "malformed_line", "malformed_line", "missing_field", None, "missing_field"]
    assert df["detail"][1] == f"{d / 'wav.scp'}:2: pipe commands not supported"
    assert df["offset"][0] == 0.5 and df["duration"][0] == 1.5
    assert df["lang"][0] == "en" and json.loads(df["extra"][0]) == {"speaker": "spk1"}
    assert df["audio_path"][4] == str(d / "rel/r3.wav") and df["text"][4] == ""


def test_kaldi_without_segments_uses_utt2dur(tmp_path: Path) -> None:
    d = tmp_path / "k"
    d.mkdir()
    (d / "wav.scp").write_text("u1 u1.wav\nu2 u2.wav\n")
    (d / "text").write_text("u1 A B\nu2 C\n")
    (d / "utt2dur").write_text("u1 1.5\nu2 x\n")
    df = read_all(d)
    assert df["duration"].to_list() == [1.5, None]
    assert df["reason"].to_list() == [None, "malformed_line"]
    assert df["id"].to_list() == ["u1", "u2"] and df["offset"].to_list() == [None, None]  # whole files: no segments file


# --- CSV / TSV / Parquet --------------------------------------------------------------------

def test_csv_quoted_fields_extra_and_bad_records(tmp_path: Path) -> None:
    src = tmp_path / "m.csv"
    src.write_text(
        'id,audio_path,duration,text,split\n'
        'u1,a.wav,1.5,"hello, world",train\n'
        'u2,b.wav,abc,plain,dev\n'
        '\n'
        'u3,c.wav,2.0,"unterminated,dev\n'
        'u4,d.wav,2.0,too,many,fields\n'
        ',e.wav,3.0,"she said ""hi""",test\n'
    )
    df = read_all(src, chunk_rows=2)
    assert df["origin"].to_list() == [f"{src}:{i}" for i in (2, 3, 5, 6, 7)]
    assert df["reason"].to_list() == [None, "malformed_line", "malformed_line", "malformed_line", None]
    assert df["text"][0] == "hello, world" and df["text"][4] == 'she said "hi"'
    assert df["id"][4] == "e.wav"  # no id: derived from the audio path
    assert json.loads(df["extra"][0]) == {"split": "train"}
    assert df["audio_path"][0] == str(tmp_path / "a.wav")


def test_tsv_has_no_quoting(tmp_path: Path) -> None:
    src = tmp_path / "m.tsv"
    src.write_text('id\tpath\tduration\ttext\nu1\tx.wav\t1.0\the said "hi, there\n')
    df = read_all(src)
    assert df["text"].to_list() == ['he said "hi, there'] and df["reason"][0] is None


def test_csv_without_text_column_is_a_user_error(tmp_path: Path) -> None:
    src = tmp_path / "m.csv"
    src.write_text("id,duration\nu1,1.0\n")
    with pytest.raises(DataprepError, match="no 'text' column"):
        read_all(src)


def test_parquet_typed_columns(tmp_path: Path) -> None:
    src = tmp_path / "m.parquet"
    pq.write_table(pa.table({
        "id": ["a", "b", None], "audio_filepath": ["x.wav", "/y.wav", "z.wav"],
        "duration": [1.0, None, 2.5], "text": ["t1", "t2", None], "sample_rate": [16000, 8000, 16000],
        "speaker": ["s1", "s2", "s3"],
    }), src)
    assert detect_format(src) == "parquet"
    df = read_all(src, chunk_rows=2)
    assert df["id"].to_list() == ["a", "b", "z.wav"]
    assert df["duration"].to_list() == [1.0, None, 2.5]
    assert df["sample_rate"].to_list() == [16000, 8000, 16000]
    assert df["origin"].to_list() == [f"{src}:{i}" for i in (1, 2, 3)]
    assert df["reason"].to_list() == [None, None, "missing_field"]
    assert json.loads(df["extra"][1]) == {"speaker": "s2"}


def test_detect_format_errors(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hello\n")
    with pytest.raises(DataprepError, match="x.txt"):
        detect_format(tmp_path / "x.txt")
    with pytest.raises(DataprepError, match="not a Kaldi"):
        detect_format(tmp_path)
    with pytest.raises(DataprepError, match="unknown source format"):
        list(iter_source(tmp_path / "x.txt", "yaml"))
    assert set(SOURCE_FORMATS) == {"nemo", "lhotse", "kaldi", "csv", "tsv", "parquet", "shar", "webdataset", "hf-parquet",
                                   "input_cfg", "lhotse-recipe"}


# --- ../shared/data -------------------------------------------------------------------------

@needs_shared
@pytest.mark.shared
@pytest.mark.parametrize("name", ["librispeech.dev-clean.csv", "commonvoice.id_ps.csv", "fsdd.all.csv"])
def test_shared_csv_and_its_nemo_conversion_agree(tmp_path: Path, name: str) -> None:
    src = SHARED / name
    with open(src, newline="", encoding="utf-8") as fh:
        expected = list(csv.DictReader(fh))
    df = read_all(src, chunk_rows=1000)
    assert df.height == len(expected) and df["reason"].null_count() == df.height
    assert df["id"].to_list() == [r["id"] for r in expected]
    assert df["duration"].to_list() == [float(r["duration"]) for r in expected]
    assert df["text"].to_list() == [r["text"] for r in expected]
    assert df["audio_path"].null_count() == df.height
    nemo = write_jsonl(tmp_path / "m.jsonl", [
        {"audio_filepath": f"audio/{r['id']}.wav", "duration": float(r["duration"]), "text": r["text"],
         "lang": r["lang"]} for r in expected])
    got = read_all(nemo, chunk_rows=777)
    assert got["text"].to_list() == df["text"].to_list()
    assert got["duration"].to_list() == df["duration"].to_list()
    assert got["id"].to_list() == [f"audio/{r['id']}.wav" for r in expected]


# --- NeMo single-parse path vs the general per-field path ------------------------------------

_JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                         st.sampled_from(["1.5", "abc", 'q"u\\ote', "tab\there", "é€𝄞", ""]))
_JSON_VALUE = st.one_of(_JSON_SCALAR, st.lists(_JSON_SCALAR, max_size=3),
                        st.dictionaries(st.text(max_size=3), _JSON_SCALAR, max_size=2))
_NEMO_KEYS = st.sampled_from(["audio_filepath", "duration", "offset", "text", "answer", "lang", "source_lang",
                              "target_lang", "taskname", "pnc", "Text", "spk", "a\"b", "é"])


@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(objs=st.lists(st.dictionaries(_NEMO_KEYS, _JSON_VALUE, max_size=7), min_size=1, max_size=25),
       raw=st.lists(st.sampled_from(['{"a": 1, "a": 2, "text": "dup"}', '{"text": "x" ', "[1]", " {\"text\": \"sp\"}",
                                     '{"audio_filepath": "x.wav", "text": "t", "rare_key": null}']), max_size=3),
       text_field=st.sampled_from(["text", "answer"]), ensure_ascii=st.booleans())
def test_nemo_single_parse_agrees_with_general_path(tmp_path_factory, objs, raw, text_field, ensure_ascii) -> None:
    """Every line read by the one-parse struct query equals the general query's reading of it."""
    import duckdb

    from manifests.readers._jsonl import NEMO_FIELDS, _slow_rows
    from manifests.readers._lines import iter_line_blocks
    from manifests.readers._normalize import base_dir_for, finish

    src = tmp_path_factory.mktemp("p") / "m.jsonl"
    lines = [json.dumps(o, ensure_ascii=ensure_ascii) for o in objs] + raw
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast = read_all(src, "nemo", text_field=text_field)
    fields = dict(NEMO_FIELDS, text=text_field)
    labels = dict(fields, id="id", sample_rate="sample_rate", channels="channels")
    con = duckdb.connect()
    ref = pl.concat([
        finish(_slow_rows(con, b, np.arange(len(b)), fields, str(src)), base_dir=base_dir_for(src, None),
               labels=labels, require_audio=True)
        for b in iter_line_blocks(src, 10_000)])
    assert fast.height == len(lines)
    assert fast.equals(ref), fast.filter(~pl.all_horizontal(pl.col("*").eq_missing(ref.select(pl.col("*")))))
