"""Outputs, round four: an output that is a file an input expands to (a blend's corpora and
tars, a source folder's files, a brace pattern's members, through links and hard links) is
refused; a target that is not a regular file is written through (a character device, a pipe,
our stdout) or refused, never replaced; every OS error at an output is one line; user text
holding ``[`` is shown as given, never as console markup."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hostile.conftest import refused
from tests.training._consumer import Corpus, invoke

REPO = Path(__file__).resolve().parents[2]


def _blend(tmp_path: Path, corpus: Corpus) -> tuple[Path, Path, Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "sub" / "b.jsonl"
    b.parent.mkdir()
    for p in (a, b):
        p.write_bytes(corpus.source.read_bytes())
    for i in range(2):
        (tmp_path / f"audio_{i}.tar").write_bytes(b"not read before the refusal")
    blend = tmp_path / "blend.yaml"
    blend.write_text("- type: nemo\n  manifest_filepath: a.jsonl\n  weight: 1\n"
                     "- type: nemo\n  manifest_filepath: sub/b.jsonl\n  weight: 2\n"
                     "- type: nemo_tarred\n  manifest_filepath: a.jsonl\n  weight: 1\n"
                     "  tarred_audio_filepaths: audio__OP_0..1_CL_.tar\n  tags: {corpus: t}\n")
    return blend, a, b


def test_an_output_that_a_blend_reads_is_refused(corpus: Corpus, tmp_path: Path) -> None:
    blend, a, b = _blend(tmp_path, corpus)
    before = {p: p.read_bytes() for p in (a, b, tmp_path / "audio_1.tar")}
    os.link(a, tmp_path / "hard.jsonl")
    (tmp_path / "soft.jsonl").symlink_to(b)
    compile_ = ("compile", blend, "--tokenizer", corpus.spm)
    refused(*compile_, "-o", b, match=("-o: is also an input", str(b), "read through SOURCE"))
    refused(*compile_, "-o", tmp_path / "m.parquet", "--rejects", a, match=("--rejects: is also an input", str(a)))
    refused(*compile_, "-o", tmp_path / "hard.jsonl", match="is also an input")  # the same inode
    refused(*compile_, "-o", tmp_path / "soft.jsonl", match="is also an input")  # a link to a corpus
    refused(*compile_, "-o", tmp_path / "audio_1.tar", match="audio_1.tar")  # a member of a brace pattern
    refused("train-tokenizer", blend, "-o", a, match="is also an input")
    refused("compile", a, "--tokenizer", corpus.spm, "--tarred-audio", tmp_path / "audio_{0..1}.tar",
            "-o", tmp_path / "audio_0.tar", match="read through --tarred-audio")
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "m.parquet").exists()


def test_an_output_that_is_a_file_of_a_source_folder_is_refused(corpus: Corpus, tmp_path: Path) -> None:
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    (kaldi / "wav.scp").write_text("u1 /a/u1.wav\n")
    (kaldi / "text").write_text("u1 hello\n")
    refused("compile", kaldi, "--tokenizer", corpus.spm, "-o", kaldi / "text", match=("is also an input", "text"))
    refused("compile", kaldi, "--tokenizer", corpus.spm, "-o", tmp_path / "m.parquet",
            "--rejects", kaldi / "wav.scp", match="read through SOURCE")
    assert (kaldi / "text").read_text() == "u1 hello\n" and (kaldi / "wav.scp").read_text() == "u1 /a/u1.wav\n"
    sups, recs = tmp_path / "x_supervisions_dev.jsonl", tmp_path / "x_recordings_dev.jsonl"
    sups.write_text('{"id": "s1", "recording_id": "r1", "start": 0, "duration": 1}\n')
    recs.write_text('{"id": "r1", "sources": [], "sampling_rate": 16000, "num_samples": 16000, "duration": 1}\n')
    refused("compile", sups, "--tokenizer", corpus.spm, "-o", recs, match=("is also an input", recs.name))
    assert recs.read_text().startswith('{"id": "r1"')


def _node(path: Path, minor: int) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))  # 1,7: /dev/full; 1,3: /dev/null
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a character device here ({exc})")
    return path


def test_a_full_character_device_is_one_line_and_never_replaced(corpus: Corpus, tmp_path: Path) -> None:
    full = _node(tmp_path / "full", 7)
    refused("stats", corpus.manifest, "--json", full, match=(str(full), "no space left on the device"))
    refused("fit-buckets", corpus.manifest, "-o", full, match="no space left on the device")
    refused("filter", corpus.manifest, "-o", tmp_path / "k.parquet", "--rejects", full, match="no space left")
    assert stat.S_ISCHR(os.stat(full).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temporary files, nothing half-published


def test_a_null_device_and_a_pipe_are_written_through(corpus: Corpus, tmp_path: Path) -> None:
    null = _node(tmp_path / "null", 3)
    invoke("stats", str(corpus.manifest), "--json", str(null))
    invoke("filter", str(corpus.manifest), "-o", str(null))  # a pair published together: the manifest first
    invoke("compile", str(corpus.source), "--tokenizer", str(corpus.spm), "--probe", "never", "-o",
           str(tmp_path / "m.parquet"), "--rejects", str(null))
    assert stat.S_ISCHR(os.stat(null).st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    invoke("stats", str(corpus.manifest), "--json", str(fifo))
    reader.join(60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and got and json.loads(got[0])


def test_stdout_is_written_through_never_replaced(corpus: Corpus, tmp_path: Path) -> None:
    """``--json /dev/stdout`` (a link to our stdout, a pipe or a redirected file) gets the JSON,
    in order with what is printed (the JSON is written before the tables); the link stays a link."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "dataprep.cli", "stats", str(corpus.manifest), "--json"]
    piped = subprocess.run([*cmd, "/dev/stdout"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith("{") and "duration < 0.5" in piped.stdout and os.path.islink("/dev/stdout")
    redirected = tmp_path / "out.txt"
    with open(redirected, "w") as fh:
        done = subprocess.run([*cmd, "/proc/self/fd/1"], cwd=REPO, env=env, stdout=fh, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = redirected.read_text()
    assert text.startswith("{") and '"languages"' in text and "duration < 0.5" in text  # nothing lost
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_socket_is_refused(corpus: Corpus) -> None:
    where = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))  # a socket's path is short (108 bytes)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(where / "s"))
        refused("stats", corpus.manifest, "--json", where / "s", match="is a socket")
        assert stat.S_ISSOCK(os.stat(where / "s").st_mode)
    finally:
        sock.close()
        (where / "s").unlink()
        where.rmdir()


def test_os_errors_at_outputs_are_one_line(corpus: Corpus, tmp_path: Path) -> None:
    """Provoked in ways that bite as root too: a path under a regular file, a name too long,
    a folder the kernel refuses (``/sys``), a read-only mount where one can be made."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    m = corpus.manifest
    refused("stats", m, "--json", blocker / "s.json", match=str(blocker / "s.json"))
    refused("fit-buckets", m, "-o", blocker / "b.json", match=str(blocker))
    refused("filter", m, "-o", blocker / "k.parquet", match="k.parquet")
    refused("compile", corpus.source, "--tokenizer", corpus.spm, "--probe", "never", "-o", blocker / "m.parquet",
            match=str(blocker))
    refused("plan-batches", m, "--buckets", corpus.buckets, "--world-size", "1", "-o", blocker / "plan",
            match=str(blocker / "plan"))
    refused("stats", m, "--json", tmp_path / ("x" * 300 + ".json"), match="file name too long")
    if os.geteuid() == 0:
        try:
            tempfile.mkstemp(dir="/sys")
        except PermissionError:
            refused("stats", m, "--json", "/sys/s.json", match=("/sys/s.json", "permission denied"))
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        refused("stats", m, "--json", locked / "s.json", match=("s.json", "permission denied"))
    assert blocker.read_text() == "x"
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
        return  # no read-only mount here (not root, or no mount rights)
    try:
        refused("stats", m, "--json", ro / "s.json", match=("s.json", "read-only file system"))
        refused("plan-batches", m, "--buckets", corpus.buckets, "--world-size", "1", "-o", ro / "plan",
                match=(f"{ro / 'plan'}: read-only file system"))
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.parametrize("name", ["a[bold]b", "[/x]", "c[red]d[/red]e", "[link=x]y"])
def test_brackets_in_paths_are_shown_as_given(corpus: Corpus, tmp_path: Path, name: str) -> None:
    """In an error, and in a summary printed after the work is done."""
    missing = tmp_path / f"{name}.parquet"
    refused("stats", missing, match=str(missing))
    out = tmp_path / f"k{name}.parquet"
    printed = invoke("filter", str(corpus.manifest), "-o", str(out))
    assert str(out) in printed and out.exists()
    blocker = tmp_path / f"f{name.replace('/', '')}[dim]"
    blocker.write_text("x")
    refused("fit-buckets", corpus.manifest, "-o", blocker / "b.json", match=str(blocker))


def test_progress_labels_are_not_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from dataprep.cli import progress

    buf = io.StringIO()
    monkeypatch.setattr(progress, "err", Console(file=buf, force_terminal=True, markup=False, width=120))
    with progress.progress_counter("reading [/x] and a[bold]b", total=2) as advance:
        advance(1, description="corpus [/y]")
        advance(1)
    assert "[/y]" in buf.getvalue()


@pytest.mark.parametrize("kind", ["nemo", "lhotse"])
def test_an_export_folder_holding_its_own_input_is_never_replaced(corpus: Corpus, plan: Path, tmp_path: Path,
                                                                  kind: str) -> None:
    exp = tmp_path / "exp"
    invoke("export", kind, str(plan), "--manifest", str(corpus.manifest), "-o", str(exp))
    inside = exp / "kept.parquet"
    inside.write_bytes(corpus.manifest.read_bytes())
    refused("export", kind, corpus.buckets, "--manifest", inside, "-o", exp,
            match=("-o: holds", "refusing to write where the inputs live"))
    assert inside.read_bytes() == corpus.manifest.read_bytes()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("[]/=#ab \\\n\t\x1b\u200b"), max_size=40))
def test_any_error_text_is_printed_as_given_on_one_line(text: str) -> None:
    import importlib

    from rich.console import Console

    app_module = importlib.import_module("dataprep.cli.app")  # the module, not the typer app of that name
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_module, "err", Console(file=buf, markup=False, highlight=False, soft_wrap=True, width=80))
        app_module.print_error(text)
    shown = buf.getvalue()
    assert shown.count("\n") == 1 and shown.startswith("error: ")
    if text.isprintable():
        assert shown == f"error: {text}\n"


def test_compile_and_filter_never_replace_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    """``-o`` naming an audio file a row refers to (or any file that is not a manifest) is
    refused in one line and the file kept; a previous manifest is replaced as before."""
    import soundfile

    from dataprep.testing import write_nemo_manifest, write_tone
    from dataprep.tokenize import train_model

    audio = write_tone(tmp_path / "a.flac", 1.0, sample_rate=16000, seed=1)
    source = write_nemo_manifest(tmp_path / "src.jsonl", [{"audio_filepath": str(audio), "duration": 1.0,
                                                           "text": "the of and"}])
    spm = tmp_path / "spm.model"
    train_model(["the of and to in is was"] * 20, spm, vocab_size=16, threads=1)
    before = audio.read_bytes()
    line = refused("compile", source, "--tokenizer", spm, "-o", audio, "--rejects", tmp_path / "r.parquet",
                   match=(str(audio), "not a Parquet file"))
    assert audio.read_bytes() == before and soundfile.info(str(audio)).frames == 16000, line
    invoke("compile", str(source), "--tokenizer", str(spm), "-o", str(tmp_path / "m.parquet"))
    invoke("compile", str(source), "--tokenizer", str(spm), "-o", str(tmp_path / "m.parquet"))  # its own: replaced
    refused("filter", tmp_path / "m.parquet", "-o", tmp_path / "f.parquet", "--rejects", source,
            match=(str(source), "not a Parquet file"))
