"""Python commands of the tests without an interpreter's start (and its imports) per command.

``python -m tests.warm_python SOCKET [MODULE[:FUNCTION] ...]`` imports the MODULEs once (the CLI,
or torch, Lightning and NeMo: 12 s of CPU each time a fresh interpreter imports NeMo) and calls
each FUNCTION (the CLI's click command, built once), then for each request
forks a child that takes the caller's stdin/stdout/stderr, working folder, environment and python
command line (``-m MODULE ARGS``, ``-c CODE ARGS`` or ``SCRIPT ARGS``), runs it as the
interpreter would (:mod:`runpy`; ``sys.path`` from the script's folder and ``PYTHONPATH``;
threads joined and ``atexit`` handlers run as at an interpreter's exit) and reports its exit
status. Each command is still a process of its own, started from a process that imported but ran
nothing (no thread pool started). Used by the docs pages' ``dataprep`` (:func:`write_shim`) and by
:func:`run_python`, the tests' ``subprocess.run([sys.executable, ...])`` for trainers' runs."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SHIM = '''#!{python} -S
import json, os, socket, struct, sys
args = sys.argv[1:]
line = [*{prefix!r}, *args]
env = dict(os.environ)
try:
    if line[:1] == ["-u"]:  # unbuffered, as torchrun starts its ranks
        line, env["PYTHONUNBUFFERED"] = line[1:], "1"
    if line and line[0].startswith("-") and line[0] not in ("-m", "-c"):
        raise OSError("an interpreter option: the interpreter itself runs it")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({sock!r})
except OSError:
    os.execv({python!r}, [{python!r}, *{prefix!r}, *args])  # the line as given
req = json.dumps({{"argv": line, "argv0": {argv0!r}, "cwd": os.getcwd(), "env": env}}).encode()
socket.send_fds(s, [struct.pack("!I", len(req)) + req], [0, 1, 2])
got = b""
while len(got) < 8:
    part = s.recv(8 - len(got))
    if not part:
        sys.stderr.write("the command's process ended without an exit status\\n")
        sys.exit(255)
    got += part
sys.exit(struct.unpack("!ii", got)[1])
'''


def write_shim(path: Path, sock: str, prefix: tuple[str, ...] = ("-m", "dataprep.cli"), argv0: str | None = "dataprep") -> None:
    """An executable at ``path`` that runs ``python *prefix ARGS`` through the server at ``sock``
    (``sys.argv[0]`` is ``argv0`` where given), or execs it itself when no server listens or the
    line starts with an interpreter option other than ``-m`` / ``-c`` (``python -u ...``)."""
    path.write_text(_SHIM.format(python=sys.executable, sock=sock, prefix=list(prefix), argv0=argv0))
    path.chmod(0o755)


def _request(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("short request")
        data += more
    return json.loads(data[4:]), fds


def _run(argv: list[str], argv0: str | None, pythonpath: str) -> None:
    """Run a python command line (without the interpreter) as ``python ARGV`` would."""
    import runpy
    import types

    base = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    extra = [os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p]
    if argv[0] == "-m":
        sys.path[:] = [os.getcwd(), *extra, *base]
        sys.argv = [argv0 or argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if argv[0] == "-c":
        sys.path[:] = ["", *extra, *base]
        sys.argv = ["-c", *argv[2:]]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), vars(main))  # noqa: S102  (what ``python -c`` does)
        return
    sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *extra, *base]
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


def _child(conn: socket.socket, req: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become the command's process, run it, report, exit."""
    import atexit as _atexit
    import traceback

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    conn.sendall(struct.pack("!i", os.getpid()))
    os.chdir(str(req["cwd"]))
    os.environ.clear()
    os.environ.update(req["env"])  # type: ignore[arg-type]
    if os.environ.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[attr-defined]
    code = 0
    try:
        try:
            _run(list(req["argv"]), req.get("argv0"), os.environ.get("PYTHONPATH", ""))  # type: ignore[arg-type]
        finally:
            threading._shutdown()  # type: ignore[attr-defined]  # as at an interpreter's exit
            _atexit._run_exitfuncs()
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


_SERVER_PYTHONPATH: set[str] = set()


def serve(path: str, preload: list[str]) -> None:
    import importlib
    import importlib.util

    _SERVER_PYTHONPATH.update(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    for entry in preload:  # the imports every command would pay (those installed), and the builds
        name, _, build = entry.partition(":")
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            module = importlib.import_module(name)
            if build:
                getattr(module, build)()
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    srv.settimeout(0.5)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while os.getppid() == parent:  # the process that started it is alive
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


def start(sock: Path, preload: tuple[str, ...]) -> subprocess.Popen[str]:
    """A server at ``sock`` that imported ``preload``, ready (it stops when its parent does). Its
    children inherit its string hash seed: 0, as the docs pages' environment sets it."""
    env = {**os.environ, "PYTHONHASHSEED": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "tests.warm_python", str(sock), *preload], env=env, cwd=REPO,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    if server.stdout is None or server.stdout.readline() != "ready\n":
        server.kill()
        raise RuntimeError(f"the warm python server ({', '.join(preload)}) did not start")
    return server


#: what the CLI's commands, the docs pages' python blocks and the benchmarks import (``MODULE:FUNCTION``:
#: and call, here the CLI's click command, built once; pandas too: pyarrow imports it, where installed,
#: the first time ``pa.array`` is given a NumPy array; torch._dynamo: DDP and fake-tensor traces)
COMMANDS = ("dataprep.cli:command", "torch", "torch._dynamo", "lhotse", "pandas")
#: what a trainer's run imports: torch, Lhotse, Lightning and NeMo (12 s of CPU in a fresh interpreter)
TRAINERS = ("torch", "lhotse", "pandas", "lightning.pytorch", "nemo.collections.asr")

_SERVERS: dict[tuple[str, ...], tuple[subprocess.Popen[str], Path]] = {}
_LOCK = threading.Lock()


def server_for(preload: tuple[str, ...]) -> Path:
    """The socket of this process's server that imported ``preload`` (started on first use)."""
    with _LOCK:
        if preload not in _SERVERS or _SERVERS[preload][0].poll() is not None:
            sock = Path(tempfile.mkdtemp(prefix="py-", dir="/tmp")) / "s"  # short: a socket path has 107 bytes
            _SERVERS[preload] = (start(sock, preload), sock)
        return _SERVERS[preload][1]


@atexit.register
def _stop_servers() -> None:
    for server, sock in _SERVERS.values():
        server.terminate()
        server.wait(timeout=60)
        sock.unlink(missing_ok=True)
        sock.parent.rmdir()


def run_python(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
               timeout: float = 600, preload: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True)``, its process
    forked from a server (one per ``preload``, started on first use, kept for the session) that
    imported ``preload`` already."""
    sock = server_for(preload)
    req = json.dumps({"argv": list(argv), "argv0": None, "cwd": str(cwd or os.getcwd()),
                      "env": dict(os.environ if env is None else env)}).encode()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as null, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(sock))
        socket.send_fds(conn, [struct.pack("!I", len(req)) + req], [null.fileno(), out.fileno(), err.fileno()])
        conn.settimeout(timeout)
        got = b""
        pid = None
        try:
            while len(got) < 8:
                part = conn.recv(8 - len(got))
                if not part:
                    raise RuntimeError(f"python {' '.join(argv)[:200]}: the process ended without an exit status")
                got += part
                if pid is None and len(got) >= 4:
                    pid = struct.unpack("!i", got[:4])[0]
        except TimeoutError:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
        code = struct.unpack("!ii", got)[1]
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, *argv], code, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))



def run_ranks(world_size: int, rank_command: Callable[[int], tuple[list[str], dict[str, str]]],
              **kwargs: object) -> list[subprocess.CompletedProcess[str]]:
    """:func:`run_python` of each rank's ``(argv, env)``, all at once (the ranks of one process
    group wait for each other), in rank order; ``kwargs`` as :func:`run_python`'s."""
    def one(rank: int) -> subprocess.CompletedProcess[str]:
        argv, env = rank_command(rank)
        return run_python(argv, env=env, **kwargs)  # type: ignore[arg-type]

    with ThreadPoolExecutor(world_size) as pool:
        return list(pool.map(one, range(world_size)))


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
