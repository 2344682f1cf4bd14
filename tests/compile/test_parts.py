"""Sharded compile: stable shard hash, per-shard parts and markers, resume, merge byte-identical
to the single-machine compile, the local process pool, kill -9 mid-write, and Ray when installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.compile import CompileOptions, compile_sources
from dataprep.compile.parts import (
    WRITE_DELAY_ENV,
    PartPaths,
    fmix64,
    fnv1a64,
    load_parts,
    part_of,
    resolve_part,
    run_part,
)
from dataprep.testing import sample_corpus, write_nemo_manifest, write_tone
from dataprep.tokenize import Tokenizers, train_model
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest, read_metadata
from tests.conftest import FEW_EXAMPLES

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def _fnv1a64_ref(data: bytes) -> int:
    """The FNV-1a 64-bit definition, byte by byte (independent of the numpy version)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def _fmix64_ref(h: int) -> int:
    m = 2**64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) % m
    h ^= h >> 33
    h = (h * 0xC4CEB93FE53B94CF) % m
    return h ^ (h >> 33)


def _invoke(*args: str, env: dict[str, str] | None = None):
    res = runner.invoke(app, list(args), env=env)
    return res


def _ok(*args: str, env: dict[str, str] | None = None) -> str:
    res = _invoke(*args, env=env)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    train_model(sample_corpus(2000)[1], path, vocab_size=200)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    """Two NeMo sources over real WAV/FLAC files: probed and given durations, segments,
    duplicate ids inside and across sources, missing/corrupt audio, empty text, a broken line."""
    root = tmp_path_factory.mktemp("corpus")
    _, texts, _ = sample_corpus(160, seed=3)
    rng = np.random.default_rng(7)
    rows_a, rows_b = [], []
    for k in range(48):
        ext = "flac" if k % 3 == 0 else "wav"
        write_tone(root / "audio" / f"f{k:03d}.{ext}", float(rng.uniform(0.3, 1.2)), sample_rate=8000, seed=k)
        rows_a.append({"audio_filepath": f"audio/f{k:03d}.{ext}", "text": texts[k], "lang": "en"})
    for k in range(48, 120):  # given durations, no probe needed
        rows_a.append({"audio_filepath": f"audio/given{k}.wav", "duration": round(float(rng.uniform(1, 9)), 2),
                       "text": texts[k], "lang": "en" if k % 2 else "de"})
    rows_a += [
        {"audio_filepath": "audio/f000.flac", "text": "the same id again"},  # duplicate in source A
        {"audio_filepath": "audio/f004.wav", "offset": 0.1, "duration": 0.2, "text": "a segment"},
        {"audio_filepath": "audio/gone.wav", "text": "missing audio"},
        {"audio_filepath": "audio/bad.wav", "text": "corrupt audio"},
        {"audio_filepath": "audio/f005.wav", "text": ""},
    ]
    (root / "audio" / "bad.wav").write_bytes(b"RIFF....WAVEfmt not audio")
    for k in range(120, 160):
        rows_b.append({"audio_filepath": f"audio/b{k}.wav", "duration": 2.5, "text": texts[k], "lang": "en"})
    rows_b += [
        {"audio_filepath": "audio/f001.wav", "text": "duplicate across sources"},
        {"audio_filepath": "audio/given50.wav", "duration": 3.0, "text": "another duplicate"},
        {"audio_filepath": "audio/b121.wav", "duration": 1.0, "text": "duplicate inside b"},
    ]
    a = write_nemo_manifest(root / "a.jsonl", rows_a)
    with open(a, "ab") as fh:
        fh.write(b'{"audio_filepath": "audio/x.wav", "text": "broken\n')
    b = write_nemo_manifest(root / "b.jsonl", rows_b)
    return [a, b]


@pytest.fixture(scope="module")
def single(corpus, spm_model, tmp_path_factory) -> tuple[Path, Path]:
    """The single-process compile of the corpus (the reference bytes)."""
    out = tmp_path_factory.mktemp("single") / "m.parquet"
    rej = out.with_name("m.rejects.parquet")
    _ok("compile", *map(str, corpus), "--tokenizer", str(spm_model), "--prompt-tokens", "3", "-o", str(out))
    return out, rej


def _compile_args(corpus: list[Path], spm_model: Path) -> list[str]:
    return ["compile", *map(str, corpus), "--tokenizer", str(spm_model), "--prompt-tokens", "3"]


# --------------------------------------------------------------------------- hashing

def test_fnv1a64_published_vectors_and_empty() -> None:
    got = fnv1a64(pa.array(["", "a", "foobar"]))
    assert [int(x) for x in got] == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60), st.integers(0, 5))
def test_fnv1a64_and_shard_match_the_byte_by_byte_definition(ids: list[str | None], cut: int) -> None:
    arr = pa.array(ids, pa.string())
    sliced = arr.slice(min(cut, len(ids)))  # a non-zero Arrow offset must not shift bytes
    expected = [_fnv1a64_ref((s or "").encode()) for s in ids[min(cut, len(ids)):]]
    assert [int(x) for x in fnv1a64(sliced)] == expected
    rows = pl.Series(np.arange(len(ids), dtype=np.int64))
    shards = part_of(pl.Series(ids, dtype=pl.String), rows, 7)
    for k, s in enumerate(ids):
        want = k % 7 if s is None else _fmix64_ref(_fnv1a64_ref(s.encode())) % 7
        assert shards[k] == want
    assert np.array_equal(fmix64(fnv1a64(arr)), np.array([_fmix64_ref(_fnv1a64_ref((s or "").encode()))
                                                          for s in ids], dtype=np.uint64))


def test_resolve_shard_from_flags_and_slurm() -> None:
    assert resolve_part(None, None, {"SLURM_ARRAY_TASK_ID": "3"}) is None  # no sharding asked
    assert resolve_part(8, None, {}) is None  # all shards here
    assert resolve_part(8, 2, {}) == (8, 2)
    assert resolve_part(None, 2, {"SLURM_ARRAY_TASK_COUNT": "16"}) == (16, 2)
    assert resolve_part(64, None, {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1"}) == (64, 4)
    with pytest.raises(DataprepError, match="needs --num-parts"):
        resolve_part(None, 2, {})
    with pytest.raises(DataprepError, match=r"not in \[0, 4\)"):
        resolve_part(4, 4, {})


# --------------------------------------------------------------------------- shards and merge

def test_sharded_compile_then_merge_is_byte_identical(corpus, spm_model, single, tmp_path) -> None:
    parts = tmp_path / "parts"
    for i in range(4):
        text = _ok(*_compile_args(corpus, spm_model), "--num-parts", "4", "--part-index", str(i), "-o", str(parts))
        assert f"part {i} of 4 done" in text
    names = sorted(p.name for p in parts.iterdir())
    assert names == sorted(f"part-{i:05d}-of-00004.{s}" for i in range(4)
                           for s in ("parquet", "rejects.parquet", "done.json"))
    # every shard holds only its ids, all copies of each id together, and the hidden row index
    total = 0
    for i in range(4):
        part = pl.read_parquet(PartPaths.of(parts, i, 4).part)
        total += part.height
        assert "__row" in part.columns
        assert (part_of(part["id"], part["__row"], 4) == i).all()
    out, rej = tmp_path / "merged.parquet", tmp_path / "merged.rejects.parquet"
    text = _ok("merge", str(parts), "-o", str(out))
    assert "merged 4 parts" in text
    ref_out, ref_rej = single
    assert out.read_bytes() == ref_out.read_bytes()
    assert rej.read_bytes() == ref_rej.read_bytes()
    assert read_metadata(out) == read_metadata(ref_out)  # content hash and provenance
    m, r = read_manifest(out), read_manifest(rej, allow_rejects=True)
    assert total == m.height and "__row" not in m.columns
    dups = r.filter(pl.col("reason") == "duplicate_id")
    assert dups.height == 4  # one in a, two across sources, one in b; the first copy of each is kept
    assert set(dups["id"]) <= set(m["id"])
    assert {"missing_audio", "unreadable_audio", "empty_text", "malformed_line"} <= set(r["reason"])


def test_rerun_skips_finished_shards_and_refuses_a_changed_fingerprint(corpus, spm_model, tmp_path) -> None:
    parts = tmp_path / "parts"
    args = [*_compile_args(corpus, spm_model), "--num-parts", "3", "-o", str(parts)]
    # shard index from a Slurm array running --array=1-3
    _ok(*args, env={"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1"})
    marker = PartPaths.of(parts, 1, 3).marker
    before = marker.stat().st_mtime_ns
    assert "already done, skipped" in _ok(*args, "--part-index", "1")
    assert marker.stat().st_mtime_ns == before
    # a deleted part is redone even with its marker present
    PartPaths.of(parts, 1, 3).part.unlink()
    assert "part 1 of 3 done" in _ok(*args, "--part-index", "1")

    res = _invoke(*_compile_args(corpus, spm_model)[:-1], "5", "--num-parts", "3", "--part-index", "0",
                  "-o", str(parts))  # --prompt-tokens 5
    assert res.exit_code == 2
    assert "written by a different run (options changed)" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = _invoke(*_compile_args(corpus, spm_model), "--num-parts", "4", "--part-index", "0", "-o", str(parts))
    assert res.exit_code == 2 and "num_shards changed" in res.output


def test_old_flags_are_hidden_aliases_and_old_markers_resume(corpus, spm_model, tmp_path) -> None:
    """``--num-shards`` / ``--shard-index`` still run (hidden from --help); a marker written before
    the rename (keys ``shard_index`` / ``num_shards``) counts as done; both names at once are refused."""
    parts = tmp_path / "parts"
    args = _compile_args(corpus, spm_model)
    assert "part 0 of 2 done" in _ok(*args, "--num-shards", "2", "--shard-index", "0", "-o", str(parts))
    marker = PartPaths.of(parts, 0, 2).marker
    m = json.loads(marker.read_text())
    m["shard_index"], m["num_shards"] = m.pop("part_index"), m.pop("num_parts")  # as the old code wrote it
    marker.write_text(json.dumps(m))
    assert "already done, skipped" in _ok(*args, "--num-parts", "2", "--part-index", "0", "-o", str(parts))
    _ok(*args, "--num-parts", "2", "--part-index", "1", "-o", str(parts))
    _ok("merge", str(parts), "-o", str(tmp_path / "m.parquet"))
    res = _invoke(*args, "--num-parts", "2", "--num-shards", "2", "--part-index", "1", "-o", str(parts))
    assert res.exit_code == 2 and "--num-shards is the old name of --num-parts" in res.output
    res = _invoke(*args, "--num-parts", "2", "--part-index", "2", "-o", str(parts))
    assert res.exit_code == 2 and "--part-index 2 is not in [0, 2)" in res.output
    text = _ok("compile", "--help")
    assert "--num-parts" in text and "--part-index" in text and "--num-shards" not in text and "--shard-index" not in text


def test_merge_refuses_missing_shards_and_mixed_runs(corpus, spm_model, tmp_path) -> None:
    parts = tmp_path / "parts"
    for i in (0, 2):
        _ok(*_compile_args(corpus, spm_model), "--num-parts", "4", "--part-index", str(i), "-o", str(parts))
    res = _invoke("merge", str(parts), "-o", str(tmp_path / "m.parquet"))
    assert res.exit_code == 2
    assert "2 of 4 parts not done: 1, 3" in res.output
    assert not (tmp_path / "m.parquet").exists()
    # a marker copied in from another run (other tokenizer options) makes a mixed set
    other = tmp_path / "other"
    _ok(*_compile_args(corpus, spm_model)[:-1], "7", "--num-parts", "4", "--part-index", "1", "-o", str(other))
    for p in other.iterdir():
        (parts / p.name).write_bytes(p.read_bytes())
    res = _invoke("merge", str(parts), "-o", str(tmp_path / "m.parquet"))
    assert res.exit_code == 2 and "parts from different runs" in res.output and "fingerprint" not in res.output
    res = _invoke("merge", str(tmp_path / "nothing"), "-o", str(tmp_path / "m.parquet"))
    assert res.exit_code == 2 and "no such folder" in res.output


def test_local_process_pool_gives_the_same_bytes(corpus, spm_model, single, tmp_path) -> None:
    out = tmp_path / "pool.parquet"
    _ok(*_compile_args(corpus, spm_model), "--workers", "2", "--num-parts", "5", "-o", str(out))
    assert out.read_bytes() == single[0].read_bytes()
    assert out.with_name("pool.rejects.parquet").read_bytes() == single[1].read_bytes()
    assert not (tmp_path / "pool.parquet.parts").exists()  # parts removed after the merge


@settings(max_examples=FEW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.sampled_from([f"u{k}" for k in range(12)] + ["é", "a b", "x" * 30]), min_size=1, max_size=40),
       num_shards=st.integers(1, 6))
def test_merge_equals_compile_for_any_duplicates_and_shard_count(ids, num_shards, spm_model, tmp_path) -> None:
    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    rows = [{"audio_filepath": f"{i}.wav", "id": i, "duration": 1.0 + k / 10, "text": "the word " * (k % 4)}
            for k, i in enumerate(ids)]
    src = write_nemo_manifest(run / "s.jsonl", rows)
    opts = CompileOptions(prompt_tokens=1)
    ref = compile_sources([src], Tokenizers.from_specs([str(spm_model)]), opts)
    for i in range(num_shards):
        run_part([src], [str(spm_model)], opts, num_shards, i, run / "parts")
    merged = load_parts(run / "parts")
    assert merged.manifest.equals(ref.manifest) and merged.rejects.equals(ref.rejects)
    assert merged.provenance == ref.provenance and merged.rows_in == len(ids)


def test_kill_9_mid_write_leaves_no_partial_part_and_the_rerun_completes(corpus, spm_model, single, tmp_path) -> None:
    parts = tmp_path / "parts"
    args = [sys.executable, "-m", "dataprep.cli", *_compile_args(corpus, spm_model), "--num-parts", "2"]
    _ok(*args[3:], "--part-index", "1", "-o", str(parts))
    env = {**os.environ, WRITE_DELAY_ENV: "30"}
    proc = subprocess.Popen([*args, "--part-index", "0", "-o", str(parts)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not list(parts.glob(".part-00000-of-00002.parquet.*.tmp")):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the shard never started writing"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    paths = PartPaths.of(parts, 0, 2)
    assert not paths.part.exists() and not paths.marker.exists()
    res = _invoke("merge", str(parts), "-o", str(tmp_path / "m.parquet"))
    assert res.exit_code == 2 and "1 of 2 parts not done: 0" in res.output
    assert "part 0 of 2 done" in _ok(*args[3:], "--part-index", "0", "-o", str(parts))
    assert not list(parts.glob(".*.tmp"))  # the killed run's temporary file is cleaned up
    _ok("merge", str(parts), "-o", str(tmp_path / "m.parquet"))
    assert (tmp_path / "m.parquet").read_bytes() == single[0].read_bytes()
    rows_in = sum(json.loads(PartPaths.of(parts, i, 2).marker.read_text())["rows_in"] for i in range(2))
    assert rows_in == read_manifest(single[0]).height + read_manifest(single[1], allow_rejects=True).height

def test_ray_executor_gives_the_same_bytes(corpus, spm_model, single, tmp_path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (the `ray` extra)")
    out = tmp_path / "ray.parquet"
    _ok(*_compile_args(corpus, spm_model), "--executor", "ray", "-o", str(out))
    assert out.read_bytes() == single[0].read_bytes()
    assert out.with_name("ray.rejects.parquet").read_bytes() == single[1].read_bytes()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(owner=st.lists(st.integers(0, 3), max_size=120), window=st.integers(1, 50), batch=st.integers(1, 9),
       dropped=st.sets(st.integers(0, 119), max_size=30))
def test_merged_tables_is_input_order_in_bounded_windows(owner, window, batch, dropped, tmp_path) -> None:
    """Rows spread over 4 parts (each sorted by __row, some rows in none: rejected) come back in
    __row order whatever the window and batch sizes."""
    import pyarrow.parquet as pq

    from dataprep.compile.parts import merged_tables

    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    run.mkdir()
    paths = []
    for shard in range(4):
        rows = [r for r, o in enumerate(owner) if o == shard and r not in dropped]
        path = run / f"p{shard}.parquet"
        pq.write_table(pa.table({"x": [f"row{r}" for r in rows], "__row": pa.array(rows, pa.int64())}), path,
                       row_group_size=7)
        paths.append(path)
    out = list(merged_tables(paths, window=window, batch_rows=batch))
    assert all(t.num_rows <= window and t.column_names == ["x"] for t in out)
    got = [v for t in out for v in t["x"].to_pylist()]
    assert got == [f"row{r}" for r in range(len(owner)) if r not in dropped]
