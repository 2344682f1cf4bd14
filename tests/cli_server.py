"""A ``dataprep`` for the docs pages' shell blocks without an interpreter's start per command.

``python -m tests.cli_server SOCKET`` imports the CLI once, then for each request forks a child
that takes the caller's stdin/stdout/stderr, working folder, environment and arguments, runs
``python -m dataprep.cli`` in it (:func:`runpy.run_module`, as ``-m`` does; threads joined and
``atexit`` handlers run as at an interpreter's exit) and reports its exit status. The shim
:func:`write_shim` puts on PATH sends the request and exits with that status; with no server it
execs ``python -m dataprep.cli`` itself. Each command is still a process of its own; the
demo's build and the CLI tests run commands in fresh interpreters."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from pathlib import Path

_SHIM = '''#!{python} -S
import json, os, socket, struct, sys
args = sys.argv[1:]
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({sock!r})
except OSError:
    os.execv({python!r}, [{python!r}, "-m", "dataprep.cli", *args])
req = json.dumps({{"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [struct.pack("!I", len(req)) + req], [0, 1, 2])
got = b""
while len(got) < 4:
    part = s.recv(4 - len(got))
    if not part:
        sys.stderr.write("dataprep: the command's process ended without an exit status\\n")
        sys.exit(255)
    got += part
sys.exit(struct.unpack("!i", got)[0])
'''


def write_shim(path: Path, sock: str) -> None:
    """An executable ``dataprep`` at ``path`` that runs its command through the server at ``sock``."""
    path.write_text(_SHIM.format(python=sys.executable, sock=sock))
    path.chmod(0o755)


def _request(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("short request")
        data += more
    return json.loads(data[4:]), fds


def _child(conn: socket.socket, req: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become the command's process, run it, report, exit."""
    import atexit
    import runpy
    import threading
    import traceback

    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(str(req["cwd"]))
    sys.path[0] = os.getcwd()  # as ``python -m`` puts the working folder first
    os.environ.clear()
    os.environ.update(req["env"])  # type: ignore[arg-type]
    sys.argv = ["dataprep", *req["argv"]]  # type: ignore[misc]
    code = 0
    try:
        try:
            runpy.run_module("dataprep.cli", run_name="__main__", alter_sys=True)
        finally:
            threading._shutdown()  # type: ignore[attr-defined]  # as at an interpreter's exit
            atexit._run_exitfuncs()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001  (an uncaught error: its traceback, status 1)
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        conn.sendall(struct.pack("!i", code))
    finally:
        os._exit(code)


def serve(path: str) -> None:
    import dataprep.cli  # noqa: F401  (the import every command would pay)

    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    srv.settimeout(0.5)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while os.getppid() == parent:  # the test that started it is alive
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        req, fds = _request(conn)
        if os.fork() == 0:
            try:
                srv.close()
                _child(conn, req, fds)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
