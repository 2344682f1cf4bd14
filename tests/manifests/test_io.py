"""Atomic writes, metadata and content hashes of compiled manifests."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests.atomic_files import atomic_path
from manifests.content_hash import ContentHasher, HASH_BLOCK_ROWS, table_hash
from manifests.errors import ManifestError
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import read_manifest, read_metadata
from manifests.manifest_write import write_manifest, write_parquet_stream, write_rejects
from manifests.rebatch import rebatch
from manifests.schema import MANIFEST_COLUMNS, MANIFEST_SCHEMA, SCHEMA_VERSION_LOOSE


def _frame(n: int = 5) -> pl.DataFrame:
    return pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": [1.0 + i for i in range(n)],
                         "text": ["a b"] * n, "num_tokens": [3] * n, "origin": [f"x.jsonl:{i + 1}" for i in range(n)]})


def test_roundtrip_schema_and_metadata(tmp_path) -> None:
    path = tmp_path / "m.parquet"
    h = write_manifest(_frame(), path, {"k": 1})
    df = read_manifest(path)
    assert tuple(df.columns) == MANIFEST_COLUMNS
    meta = read_metadata(path)
    assert meta["schema_version"] == SCHEMA_VERSION_LOOSE and meta["content_hash"] == h
    assert meta["provenance"] == {"k": 1} and meta["kind"] == "manifest"


def test_container_columns_only_when_a_row_is_in_a_container(tmp_path) -> None:
    """A loose-file manifest stays version 1 (same bytes and hash, empty container columns or
    none); one row in a container makes it version 2 with the addressing columns."""
    from manifests.schema import CONTAINER_COLUMNS, SCHEMA_VERSION, SCHEMA_VERSION_CONTAINERS, SCHEMA_VERSION_CORPUS

    loose = _frame()
    h1 = write_manifest(loose, tmp_path / "a.parquet")
    nulls = loose.with_columns(pl.lit(None, pl.String).alias("container"), pl.lit(None, pl.Int64).alias("member_offset"))
    h2 = write_manifest(nulls, tmp_path / "b.parquet")
    assert h1 == h2 and (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    boxed = loose.with_columns(pl.lit("/d/s.tar").alias("container"), pl.lit(512, pl.Int64).alias("member_offset"),
                               pl.lit(100, pl.Int64).alias("member_size"))
    h3 = write_manifest(boxed, tmp_path / "c.parquet")
    df = read_manifest(tmp_path / "c.parquet")
    assert tuple(df.columns) == MANIFEST_COLUMNS + CONTAINER_COLUMNS and h3 != h1
    assert read_metadata(tmp_path / "c.parquet")["schema_version"] == SCHEMA_VERSION_CONTAINERS == 2
    assert df["member_offset"].to_list() == [512] * 5 and df["row_group"].null_count() == 5
    # a corpus column (many corpora) is version 3, last; a null one is not written at all
    h4 = write_manifest(loose.with_columns(pl.lit(None, pl.String).alias("corpus")), tmp_path / "d.parquet")
    assert h4 == h1
    write_manifest(boxed.with_columns(pl.lit("ls").alias("corpus")), tmp_path / "e.parquet")
    assert tuple(read_manifest(tmp_path / "e.parquet").columns) == MANIFEST_COLUMNS + CONTAINER_COLUMNS + ("corpus",)
    assert read_metadata(tmp_path / "e.parquet")["schema_version"] == SCHEMA_VERSION_CORPUS == 3
    # a modality column (text-only rows) is version 4, after corpus; a null one is not written
    assert write_manifest(loose.with_columns(pl.lit(None, pl.String).alias("modality")), tmp_path / "f.parquet") == h1
    write_manifest(boxed.with_columns(pl.lit("ls").alias("corpus"), pl.lit("audio").alias("modality")),
                   tmp_path / "g.parquet")
    assert read_manifest(tmp_path / "g.parquet").columns[-2:] == ["corpus", "modality"]
    assert read_metadata(tmp_path / "g.parquet")["schema_version"] == SCHEMA_VERSION == 4


def test_hash_depends_on_data_only(tmp_path) -> None:
    a = write_manifest(_frame(), tmp_path / "a.parquet", {"p": 1})
    b = write_manifest(_frame(), tmp_path / "b.parquet", {"p": 2})
    c = write_manifest(_frame().with_columns(pl.col("duration") + 0.001), tmp_path / "c.parquet")
    assert a == b != c
    assert (tmp_path / "a.parquet").read_bytes() != b""


def test_write_is_byte_identical(tmp_path) -> None:
    write_manifest(_frame(), tmp_path / "a.parquet")
    write_manifest(_frame(), tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_crash_mid_write_leaves_target_untouched(tmp_path) -> None:
    target = tmp_path / "m.parquet"
    write_manifest(_frame(), target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half a file")
            raise RuntimeError("crash")
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.parquet"]


def test_outputs_have_ordinary_permissions(tmp_path) -> None:
    import os

    write_manifest(_frame(), tmp_path / "m.parquet")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "m.parquet").stat().st_mode & 0o777 == 0o666 & ~mask


def test_not_a_manifest_is_one_line_error(tmp_path) -> None:
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ManifestError, match=r"x.parquet: not a readable Parquet file") as exc:
        read_manifest(bad)
    assert "\n" not in str(exc.value)


# --------------------------------------------------------------------------- content hash




def _with_garbage_under_nulls(arr: pa.Array) -> pa.Array:
    """The same values, with non-zero bytes under every null slot (a layout ``take`` or a
    reader may leave): numbers get 7, strings get 'junk' in the data buffer."""
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_string(arr.type):
        vals = [s if ok else "junk" for s, ok in zip(arr.to_pylist(), valid)]
        filled = pa.array(vals, pa.string())
    else:
        filled = pa.array(np.where(valid, arr.fill_null(0).to_numpy(zero_copy_only=False), 7), arr.type)
    bitmap = pa.array(valid, pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(arr.type, len(arr), [bitmap, *filled.buffers()[1:]], null_count=int((~valid).sum()))


_rows = st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=8)), st.one_of(st.none(), st.floats(allow_nan=False)),
                           st.one_of(st.none(), st.integers(-2**31, 2**31 - 1))), max_size=40)


@settings(max_examples=60, deadline=None)
@given(rows=_rows, cuts=st.lists(st.integers(0, 40), max_size=4), data=st.data())
def test_hash_is_of_values_not_layout(rows, cuts, data) -> None:
    s, f, i = zip(*rows) if rows else ((), (), ())
    table = pa.table({"s": pa.array(s, pa.string()), "f": pa.array(f, pa.float64()), "i": pa.array(i, pa.int32())})
    h = table_hash(table)
    # other chunking, fed in other splits, with garbage under nulls, sliced out of a bigger table
    bounds = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    pieces = [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    chunked = pa.Table.from_batches([b for p in pieces for b in p.to_batches()], schema=table.schema) if pieces \
        else table
    hasher = ContentHasher(table.schema)
    for p in pieces:
        hasher.update(p)
    garbage = pa.table({n: _with_garbage_under_nulls(table[n].combine_chunks()) for n in table.column_names})
    padded = pa.concat_tables([table.slice(0, 3), table, table.slice(0, 2)]).combine_chunks().slice(min(3, len(rows)),
                                                                                                   len(rows))
    large = table.cast(pa.schema([("s", pa.large_string()), ("f", pa.float64()), ("i", pa.int32())]))
    assert padded.num_rows == len(rows)  # a slice at a non-zero offset of a bigger buffer
    assert {table_hash(chunked), hasher.hexdigest(), table_hash(garbage), table_hash(large), table_hash(padded)} == {h}
    # any value change changes the hash
    if rows:
        k = data.draw(st.integers(0, len(rows) - 1))
        s2 = list(s)
        s2[k] = (s[k] or "") + "x"
        f2 = list(f)
        f2[k] = None if f[k] is not None else 1.5
        for col, vals, typ in (("s", s2, pa.string()), ("f", f2, pa.float64())):
            changed = table.set_column(table.schema.get_field_index(col), col, pa.array(vals, typ))
            assert table_hash(changed) != h
        assert table_hash(table.slice(0, len(rows) - 1)) != h  # one row fewer


def test_hash_blocks_and_null_vs_empty_string() -> None:
    n = HASH_BLOCK_ROWS + 5
    a = pa.table({"x": pa.array(np.arange(n, dtype=np.int64))})
    b = pa.table({"x": pa.array(np.r_[np.arange(n - 1), n], pa.int64())})  # last row differs, 2nd block
    assert table_hash(a) != table_hash(b)
    assert table_hash(pa.table({"s": pa.array([None], pa.string())})) != table_hash(pa.table({"s": pa.array([""])}))
    assert table_hash(pa.table({"s": pa.array(["ab", "c"])})) != table_hash(pa.table({"s": pa.array(["a", "bc"])}))
    assert table_hash(pa.table({"x": pa.array([1], pa.int32())})) != table_hash(pa.table({"y": pa.array([1], pa.int32())}))


def test_rebatch_gives_exact_sizes() -> None:
    t = pa.table({"x": np.arange(23)})
    out = list(rebatch([t.slice(0, 5), t.slice(5, 1), t.slice(6, 17)], 4))
    assert [o.num_rows for o in out] == [4] * 5 + [3]
    assert pa.concat_tables(out)["x"].to_pylist() == list(range(23))
    assert list(rebatch([], 4)) == []


def test_streamed_file_is_byte_identical_to_write_manifest(tmp_path) -> None:
    df = _frame(50).with_columns(pl.when(pl.col("duration") > 20).then(None).otherwise(pl.col("text")).alias("text"))
    h = write_manifest(df, tmp_path / "a.parquet", {"p": 1}, row_group_size=16)
    from manifests.schema import POLARS_SCHEMA, conform

    table = conform(df, POLARS_SCHEMA).to_arrow().cast(MANIFEST_SCHEMA)
    made = write_parquet_stream(lambda: (table.slice(k, 7) for k in range(0, 50, 7)), tmp_path / "b.parquet",
                                MANIFEST_SCHEMA, "manifest", {"p": 1}, row_group_size=16)
    assert made.content_hash == h and made.rows == 50
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert pq_row_groups(tmp_path / "b.parquet") == [16, 16, 16, 2]
    # empty: one empty row group, like pq.write_table
    from manifests.schema import empty_rejects

    write_rejects(empty_rejects(), tmp_path / "e.parquet")
    assert pq_row_groups(tmp_path / "e.parquet") == [0]
    assert read_manifest(tmp_path / "e.parquet", allow_rejects=True).height == 0


def test_stream_refuses_a_second_pass_that_differs(tmp_path) -> None:
    table = conform_frame(_frame(5))
    calls = iter([[table], [table.slice(0, 4)]])
    with pytest.raises(AssertionError, match="second pass"):
        write_parquet_stream(lambda: next(calls), tmp_path / "x.parquet", MANIFEST_SCHEMA, "manifest")
    assert not (tmp_path / "x.parquet").exists()


def pq_row_groups(path) -> list[int]:
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def conform_frame(df: pl.DataFrame) -> pa.Table:
    from manifests.schema import POLARS_SCHEMA, conform

    return conform(df, POLARS_SCHEMA).to_arrow().cast(MANIFEST_SCHEMA)


def test_conform_of_an_empty_frame_has_no_rows() -> None:
    from manifests.schema import MANIFEST_COLUMNS, conform

    out = conform(pl.DataFrame())
    assert out.height == 0 and tuple(out.columns) == MANIFEST_COLUMNS


_RANK = """
import sys, time
import manifests.hash_cache as io
real = io.recompute_hash
def counted(path):
    with open(sys.argv[3], "a") as log:
        log.write("recompute\\n")
    time.sleep(1.0)  # hold the lock long enough for the other rank to arrive
    return real(path)
io.recompute_hash = counted
print(io.manifest_hash(sys.argv[1], cache_dir=sys.argv[2]))
"""


def test_ranks_verifying_one_copied_manifest_hash_it_once(tmp_path) -> None:
    """Several ranks opening a manifest copied onto their machine (so never verified there):
    one recomputes the rows' hash, the others wait for its verification under the lock."""
    import shutil
    import subprocess
    import sys

    src = tmp_path / "written.parquet"
    write_manifest(pl.DataFrame({"id": [f"u{i}" for i in range(2000)], "duration": np.linspace(1, 9, 2000)}), src)
    copy = tmp_path / "copied.parquet"
    shutil.copy(src, copy)  # new mtime: no verification is on record for it
    log = tmp_path / "recomputed.log"
    ranks = [subprocess.Popen([sys.executable, "-c", _RANK, str(copy), str(tmp_path / "cache"), str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    hashes = {p.communicate(timeout=120)[0].strip() for p in ranks}
    assert all(p.returncode == 0 for p in ranks)
    assert hashes == {manifest_hash(src)}
    assert log.read_text().splitlines() == ["recompute"]


def test_cache_dir_is_resolved_at_each_call(tmp_path, monkeypatch) -> None:
    from manifests.hash_cache import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPEECH_DATAPREP_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "speech-dataprep"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "speech-dataprep"
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_manifest_hash_with_a_cache_dir_writes_only_there(tmp_path, monkeypatch) -> None:
    """A caller's cache directory is the only place a verification goes: nothing under the
    default cache, nothing in the process memo (which answers only for the default)."""
    import shutil

    import manifests.hash_cache as mio

    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "default"))
    src = tmp_path / "written.parquet"
    write_manifest(pl.DataFrame({"id": ["a", "b"], "duration": [1.0, 2.0]}), src)
    shutil.rmtree(tmp_path / "default")  # the writer's own record
    copy = tmp_path / "copied.parquet"
    shutil.copy(src, copy)
    memo = dict(mio._VERIFIED)
    mine = tmp_path / "mine"
    assert manifest_hash(copy, mine) == mio.recorded_hash(copy)
    assert not (tmp_path / "default").exists()
    assert mio._VERIFIED == memo
    assert len(list((mine / "content-hash").iterdir())) == 1
    manifest_hash(copy)  # the default: its own directory and the memo
    assert len(list((tmp_path / "default" / "content-hash").iterdir())) == 1


#: struct format of each fixed-width Arrow type, as the documented definition lays values out
_LE = {"int8": "<b", "int16": "<h", "int32": "<i", "int64": "<q", "uint8": "<B", "uint16": "<H", "uint32": "<I",
       "uint64": "<Q", "float": "<f", "double": "<d", "bool": "<B"}


def _documented_hash(table: pa.Table) -> str:
    """The content hash recomputed, one value at a time, from its written definition
    (:class:`manifests.content_hash.ContentHasher`'s docstring; the README's "Compiled manifest" section):
    the domain line, each field's name and type, then per block of 65,536 rows and per column
    the validity bits (MSB first) and the values with nulls filled (little-endian numbers; for
    strings int64 offsets from 0 and the UTF-8 bytes), then the row count as 8 bytes."""
    import hashlib
    import struct

    h = hashlib.sha256(b"speech_dataprep content hash v2\n")
    for f in table.schema:
        name = "string" if str(f.type) in ("large_string", "string_view") else str(f.type)
        h.update(f.name.encode() + b"\0" + name.encode() + b"\n")
    columns = {f.name: (str(f.type), table.column(f.name).to_pylist()) for f in table.schema}
    n = table.num_rows
    for start in range(0, n, 65536):
        for kind, values in columns.values():
            block = values[start:start + 65536]
            bits = [v is not None for v in block] + [False] * (-len(block) % 8)
            h.update(bytes(sum(b << (7 - j) for j, b in enumerate(bits[i:i + 8])) for i in range(0, len(bits), 8)))
            if kind in ("string", "large_string"):
                data = [(v or "").encode() for v in block]
                offsets = [0]
                for d in data:
                    offsets.append(offsets[-1] + len(d))
                h.update(b"".join(struct.pack("<q", o) for o in offsets) + b"".join(data))
            else:
                h.update(b"".join(struct.pack(_LE[kind], 0 if v is None else v) for v in block))
    h.update(struct.pack("<Q", n))
    return h.hexdigest()


def test_content_hash_recomputed_from_its_documented_definition(tmp_path) -> None:
    """A compiled manifest's recorded hash, and a 2-block table with nulls everywhere, equal the
    hash computed by hand from the definition a user reads (not through ContentHasher)."""
    from manifests.manifest_read import recorded_hash

    rng = np.random.default_rng(7)
    n = 40
    df = pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": rng.uniform(0.5, 20, n).tolist(),
                       "text": [None if i % 7 == 3 else "ü " * (i % 5) for i in range(n)],
                       "num_tokens": [None if i % 9 == 4 else int(i) for i in range(n)],
                       "sample_rate": [16000 if i % 2 else None for i in range(n)],
                       "origin": [f"x.jsonl:{i + 1}" for i in range(n)]})
    path = tmp_path / "m.parquet"
    write_manifest(df, path)
    stored = pq.read_table(path).replace_schema_metadata(None)
    assert stored.schema == MANIFEST_SCHEMA
    assert _documented_hash(stored) == recorded_hash(path) == manifest_hash(path, cache_dir=tmp_path / "c")
    big = HASH_BLOCK_ROWS + 1000
    table = pa.table({
        "i": pa.array([None if i % 11 == 0 else i - 500 for i in range(big)], pa.int64()),
        "h": pa.array([i % 300 for i in range(big)], pa.int16()),
        "f": pa.array([None if i % 13 == 0 else i / 7 for i in range(big)], pa.float32()),
        "b": pa.array([None if i % 5 == 0 else bool(i % 2) for i in range(big)], pa.bool_()),
        "s": pa.array([None if i % 17 == 0 else f"r{i}" * (i % 3) for i in range(big)], pa.large_string()),
    })
    assert _documented_hash(table) == table_hash(table)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(min_value=1, max_value=40), n=st.integers(min_value=1, max_value=30))
def test_corpus_codes_in_blocks_equal_the_whole_column(tmp_path_factory, rows: int, n: int) -> None:
    from manifests.corpus_codes import iter_corpus_codes, read_corpus_codes

    path = tmp_path_factory.mktemp("cc") / "m.parquet"
    corpora = ["ls", "cv", "mls"]
    write_manifest(pl.DataFrame({"id": [f"u{i}" for i in range(n)], "audio_path": ["/a.wav"] * n,
                                 "duration": [1.0] * n, "text": ["x"] * n, "num_tokens": [3] * n,
                                 "corpus": [corpora[(i * i) % 3] for i in range(n)]}), path)
    whole, _ = read_corpus_codes(path, ["cv", "ls"])
    blocks = list(iter_corpus_codes(path, ["cv", "ls"], rows))
    assert all(b.size == rows for b in blocks[:-1]) and all(0 < b.size <= rows for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks) if blocks else np.empty(0, np.int32), whole)
    assert (whole == -1).sum() == sum(corpora[(i * i) % 3] == "mls" for i in range(n))


def test_verify_manifest_rows_recomputes_and_names_the_expectation(tmp_path) -> None:
    from manifests.errors import ManifestError
    from manifests.hash_cache import verify_manifest_rows

    path = tmp_path / "m.parquet"
    h = write_manifest(pl.DataFrame({"id": ["a", "b"], "audio_path": ["/a.wav"] * 2, "duration": [1.0, 2.0],
                                     "text": ["x", "y"], "num_tokens": [3, 4]}), path)
    verify_manifest_rows(path, h, "the plan's manifest")
    with pytest.raises(ManifestError, match="differs from the plan's manifest"):
        verify_manifest_rows(path, "0" * 64, "the plan's manifest")
    t = pq.read_table(path)
    pq.write_table(t.set_column(0, "id", pa.array(["a", "c"])), path)  # metadata (hash) kept, rows edited
    with pytest.raises(ManifestError, match="rows hash to"):
        verify_manifest_rows(path, h, "the plan's manifest")
