"""A disk that fills up mid-write, and every other OS error at an output: every command says
so in one line naming the output (exit 2), the temporary file it was writing is gone, the
target untouched."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dataprep.cli.app import user_errors
from manifests.atomic_files import atomic_path


def _command(target: Path, code: int) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @user_errors
    def write() -> None:
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise OSError(code, os.strerror(code), str(tmp))  # what write(2) raises on a full disk

    return app


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path, code: int) -> None:
    target = tmp_path / "out.json"
    target.write_text("before")
    res = CliRunner().invoke(_command(target, code), [])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "no space left on the device" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"] and target.read_text() == "before"


@pytest.mark.parametrize(("code", "words"), [(errno.EIO, "input/output error"), (errno.EROFS, "read-only file system"),
                                           (errno.EACCES, "permission denied")])
def test_other_os_errors_are_one_line_and_not_disguised(tmp_path: Path, code: int, words: str) -> None:
    target = tmp_path / "out.json"
    res = CliRunner().invoke(_command(target, code), [])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {target}: {words}"), res.output
    assert "no space" not in res.output and list(tmp_path.iterdir()) == []
