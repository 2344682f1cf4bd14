"""Nothing overwritten or lost: outputs equal to inputs or to each other, plan directories
holding other files, checkpoint directories holding a run, pairs published together, litter
of killed runs removed by the next run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from manifests.atomic_files import write_json
from manifests.outputs import publish_together
from tests.hostile.conftest import refused
from tests.training._consumer import Corpus, invoke


def test_compile_output_equal_to_rejects_or_to_a_source(corpus: Corpus, tmp_path: Path) -> None:
    x = tmp_path / "x.parquet"
    refused("compile", corpus.source, "--tokenizer", corpus.spm, "-o", x, "--rejects", x,
            match=("-o and --rejects name the same file",))
    assert not x.exists()
    src = tmp_path / "src.jsonl"
    src.write_bytes(corpus.source.read_bytes())
    refused("compile", src, "--tokenizer", corpus.spm, "-o", src, match="is also the input")
    refused("compile", src, "--tokenizer", corpus.spm, "-o", tmp_path / "m.parquet", "--rejects", src,
            match="is also the input")
    refused("compile", src, "--tokenizer", corpus.spm, "-o", corpus.spm, match="is also the input --tokenizer")
    assert src.read_bytes() == corpus.source.read_bytes()


def test_same_file_through_a_symlink(corpus: Corpus, tmp_path: Path) -> None:
    m = tmp_path / "m.parquet"
    m.write_bytes(corpus.manifest.read_bytes())
    link = tmp_path / "link.parquet"
    link.symlink_to(m)
    refused("filter", m, "-o", link, match="is also the input")
    refused("filter", m, "-o", tmp_path / "k.parquet", "--rejects", m, match="is also the input")
    assert m.read_bytes() == corpus.manifest.read_bytes()


def test_filter_fit_and_stats_outputs(corpus: Corpus, tmp_path: Path) -> None:
    m = tmp_path / "m.parquet"
    m.write_bytes(corpus.manifest.read_bytes())
    refused("filter", m, "-o", tmp_path / "k.parquet", "--rejects", tmp_path / "k.parquet", match="same file")
    refused("fit-buckets", m, "-o", m, match="is also the input")
    refused("stats", m, "--json", m, match="is also the input")
    refused("padding", m, "--buckets", corpus.buckets, "--json", corpus.buckets, match="is also the input")
    assert m.read_bytes() == corpus.manifest.read_bytes()


def test_plan_dir_with_other_files_is_never_deleted(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "p"
    invoke("plan-batches", str(corpus.manifest), "--buckets", str(corpus.buckets), "--world-size", "1", "-o", str(out))
    (out / "notes.txt").write_text("mine")
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "--world-size", "1", "-o", out,
            match=("not a plan directory", "notes.txt"))
    assert (out / "notes.txt").read_text() == "mine" and (out / "plan.json").exists()
    f = tmp_path / "file"
    f.write_text("keep")
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "--world-size", "1", "-o", f,
            match="not a plan directory")
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "--world-size", "1", "-o",
            corpus.manifest, match="is also the input")
    assert f.read_text() == "keep"


def test_plan_dir_holding_only_a_plan_is_replaced(corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "p"
    for seed in ("0", "1"):
        invoke("plan-batches", str(corpus.manifest), "--buckets", str(corpus.buckets), "--world-size", "2",
               "--seed", seed, "-o", str(out))
    assert json.loads((out / "plan.json").read_text())["seed"] == 1
    invoke("plan-batches", str(corpus.manifest), "--buckets", str(corpus.buckets), "--world-size", "1", "-o", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "rank-00000.parquet"]  # rank 1 of the old plan gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no temporary folders left


def test_export_output_equal_to_an_input(corpus: Corpus, plan: Path) -> None:
    refused("export", "nemo", plan, "--manifest", corpus.manifest, "-o", plan, match="is also the input")


def test_publish_together_on_an_error_changes_nothing(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("PAR1 old a")  # what it replaces is Parquet (a manifest, its rejects): the magic is checked
    b.write_text("PAR1 old b")
    with pytest.raises(RuntimeError), publish_together(a, b) as (ta, tb):
        ta.write_text("new a")
        tb.write_text("new b")
        raise RuntimeError("boom")
    assert (a.read_text(), b.read_text()) == ("PAR1 old a", "PAR1 old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_kill_between_the_renames_never_pairs_new_and_old(tmp_path: Path) -> None:
    """The writer process is killed (os._exit, no cleanup) right after the companion's rename."""
    m, r = tmp_path / "m.parquet", tmp_path / "m.rejects.parquet"
    m.write_text("PAR1 old manifest")  # Parquet's magic: publish_together replaces only Parquet files
    r.write_text("PAR1 old rejects")
    code = f"""
import os
import manifests.atomic_files as mio
from manifests.outputs import publish_together
real = os.replace
def replace_then_die(src, dst):
    real(src, dst)
    if str(dst).endswith("rejects.parquet"):
        os._exit(9)
mio.os.replace = replace_then_die
with publish_together({str(m)!r}, {str(r)!r}) as (tm, tr):
    tm.write_text("new manifest")
    tr.write_text("new rejects")
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert res.returncode == 9
    assert r.read_text() == "new rejects"
    assert not m.exists()  # the old manifest is gone: it can never be read with the new rejects
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".m.parquet.")  # the killed writer's temp...
    write_json({"x": 1}, tmp_path / "m.parquet")  # ...removed by the next write of that output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_litter_of_killed_runs_is_swept_by_the_next_compile(corpus: Corpus, tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    pid = int(dead.stdout)
    out = tmp_path / "m.parquet"
    (tmp_path / f".m.parquet.{pid}.abc123.tmp").write_bytes(b"half a manifest")
    spool = tmp_path / f".m.parquet.{pid}.xyz.spool"
    spool.mkdir()
    (spool / "accepted.parquet").write_bytes(b"spooled rows")
    (tmp_path / f".m.rejects.parquet.{pid}.q.tmp").write_bytes(b"half the rejects")
    live = tmp_path / f".m.parquet.{os.getpid()}.live.tmp"  # a writer still running: left alone
    live.write_bytes(b"in progress")
    invoke("compile", str(corpus.source), "--tokenizer", str(corpus.spm), "--probe", "never", "-o", str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "m.parquet", "m.rejects.parquet"])


def test_sigterm_mid_compile_leaves_no_temporary_files(corpus: Corpus, tmp_path: Path) -> None:
    """A scheduler's kill (SIGTERM) while compile spools: exit 143, nothing half-written left."""
    import signal
    import time

    src = tmp_path / "big.jsonl"
    line = '{{"audio_filepath": "a/{i}.flac", "duration": 2.5, "text": "the of and to in is was that"}}\n'
    src.write_text("".join(line.format(i=i) for i in range(300_000)))
    out = tmp_path / "out" / "m.parquet"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "dataprep.cli", "compile", str(src), "--tokenizer", str(corpus.spm),
                             "--probe", "never", "-o", str(out)], cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.parent.is_dir() and any(p.name.endswith(".spool") for p in out.parent.iterdir()):
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("compile finished before it could be interrupted")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 143, proc.stderr.read() if proc.stderr else ""
    assert list(out.parent.iterdir()) == []


def test_report_never_replaces_an_input_or_a_file_it_did_not_write(corpus: Corpus, plan: Path,
                                                                   tmp_path: Path) -> None:
    pytest.importorskip("altair", reason="the report extra (altair) is not installed")
    m = tmp_path / "m.parquet"
    m.write_bytes(corpus.manifest.read_bytes())
    link = tmp_path / "link.html"
    link.symlink_to(m)
    refused("report", m, "-o", m, match="is also the input MANIFEST")
    refused("report", m, "-o", link, match="is also the input MANIFEST")
    refused("report", m, "--buckets", corpus.buckets, "-o", corpus.buckets, match="is also the input --buckets")
    notes = tmp_path / "notes.html"
    notes.write_text("<p>mine</p>")
    refused("report", m, "-o", notes, match="not a report this tool wrote")
    refused("report", m, "-o", tmp_path, match="not a report this tool wrote")
    refused("report", corpus.manifest, "--plan", plan, "-o", plan / "r.html", match="inside the plan directory")
    refused("report", m, "--rejects", m, "-o", tmp_path / "r.html", match="not a rejects file")
    refused("report", m, "--world-sizes", "2,x", "-o", tmp_path / "r.html", match="--world-sizes")
    assert m.read_bytes() == corpus.manifest.read_bytes() and notes.read_text() == "<p>mine</p>"
    assert not (plan / "r.html").exists() and not (tmp_path / "r.html").exists()


def test_pack_into_an_input_folder_or_a_link_to_it_is_refused(corpus: Corpus, tmp_path: Path) -> None:
    """``pack`` refuses an output folder holding a file the manifest reads, through a linked
    folder and through a linked audio file too; nothing is written, the audio is unchanged."""
    from manifests.manifest_read import read_manifest

    audio = Path(read_manifest(corpus.manifest)["audio_path"][0]).parent
    before = {p.name: p.stat().st_mtime_ns for p in audio.iterdir()}
    link = tmp_path / "linked"
    link.symlink_to(audio)
    for out in (audio, link, audio.parent):
        refused("pack", corpus.manifest, "-o", out, "--layout", "webdataset", match="refusing to write where the inputs live")
    # a manifest whose audio_path is a link (elsewhere) to a file inside the output folder
    import polars as pl

    from manifests.manifest_write import write_manifest

    df = read_manifest(corpus.manifest)
    first = Path(df["audio_path"][0])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / first.name).symlink_to(first)
    linked = tmp_path / "linked.parquet"
    write_manifest(df.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.lit(str(outside / first.name)))
                                   .otherwise(pl.col("audio_path")).alias("audio_path")), linked)
    refused("pack", linked, "-o", audio, "--layout", "shar", match="refusing to write where the inputs live")
    assert {p.name: p.stat().st_mtime_ns for p in audio.iterdir()} == before
