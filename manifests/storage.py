"""Local paths and object-store URLs (``s3://``, ``gs://``, ``az://`` / ``abfs://``) read and written alike.

Reads: :func:`stat` (size, ETag, version), :func:`read_ranges` (``(offset, length)`` byte ranges;
neighbours closer than ``gap`` bytes are one request, a call's requests run in parallel),
:func:`read_bytes`, :func:`open_input` (seekable; each read a range request: a header probe never
reads the whole object; a local copy: :func:`manifests.store_facts.fetch_local`). Writes:
:func:`write_atomic` (a local temporary file renamed by :mod:`manifests.atomic_files`, or
uploaded) and :func:`open_output` (a stream); an object is completed only when whole (multipart
upload aborted on any error). Invariants: URL reads are checked for length and, by ``If-Match``,
for the ETag first seen: a short or changed body is never data. Transient faults (503 SlowDown,
5xx, reset, time-out, short body) get :data:`RETRY` attempts with backoff, then one
:class:`StoreError` line naming the object. Credentials come only from each store's standard
environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) or ``~/.aws``; never printed or written.
Library: obstore (Rust object_store), chosen by ``benchmarks/bench_store_clients.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from manifests.errors import os_error_line
from manifests.store_paths import (  # noqa: F401 (re-exported)
    SCHEMES, StoreError, is_url, join, local_path, name, parent, resolve, split_url,
)


@dataclass(frozen=True)
class ObjectInfo:
    """An object's (or local file's) size in bytes, ETag and version (``None`` where the store
    has none; a local file has neither)."""

    size: int
    etag: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all; the wait before try k+1 is ``min(max_backoff_s,
    backoff_s * 2**k)``; ``timeout_s`` bounds one request."""

    attempts: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    timeout_s: float = 30.0


def _env_policy() -> RetryPolicy:
    env = os.environ
    return RetryPolicy(attempts=max(1, int(env.get("DATAPREP_STORE_ATTEMPTS", "5"))),
                       backoff_s=float(env.get("DATAPREP_STORE_BACKOFF_S", "0.1")),
                       timeout_s=float(env.get("DATAPREP_STORE_TIMEOUT_S", "30")))


#: the retry policy of every store request (``DATAPREP_STORE_ATTEMPTS``, ``_BACKOFF_S``, ``_TIMEOUT_S``)
RETRY = _env_policy()
#: ranges closer than this many bytes are read in one request (a gap costs less than a round trip)
DEFAULT_GAP = 64 * 1024
#: most requests in flight at once per process (bounded concurrency of range reads and probes)
MAX_CONCURRENCY = 16


# ----------------------------------------------------------------------------- stores
_stores: dict[str, Any] = {}
_infos: dict[str, ObjectInfo] = {}
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
#: called by :func:`reset_clients` (a cache of facts about objects closes its database)
ON_RESET: list[Any] = []


def reset_clients() -> None:
    """Forget every client, remembered object and the retry policy (read again from the
    environment): after the environment's credentials, endpoint or ``DATAPREP_STORE_*`` change."""
    global RETRY
    for hook in ON_RESET:
        hook()
    with _lock:
        _stores.clear()
        _infos.clear()
        RETRY = _env_policy()


def _obstore() -> Any:
    from manifests.optional import require
    return require("obstore", "reading or writing s3://, gs:// or az:// URLs")


def _store(root: str) -> Any:
    """The client of one bucket (made once per process, credentials from the environment)."""
    key = root
    with _lock:
        if key in _stores:
            return _stores[key]
    _obstore()
    from obstore.store import from_url
    scheme = root.partition("://")[0]
    kw: dict[str, Any] = {"retry_config": {"max_retries": 0},  # retried here (one policy, checked bodies)
                          "client_options": {"timeout": f"{RETRY.timeout_s}s",
                                             "connect_timeout": f"{min(RETRY.timeout_s, 10.0)}s"}}
    if scheme in ("s3", "s3a"):
        root = "s3://" + root.partition("://")[2]
        if not os.environ.get("AWS_ACCESS_KEY_ID") and _has_aws_profile():
            with contextlib.suppress(ImportError):  # profiles of ~/.aws, as the AWS CLI reads them
                from obstore.auth.boto3 import Boto3CredentialProvider
                kw["credential_provider"] = Boto3CredentialProvider()
        ep = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if ep and ep.startswith("http://"):
            kw["client_options"]["allow_http"] = True
    elif scheme in ("gcs", "azure"):
        root = {"gcs": "gs", "azure": "az"}[scheme] + "://" + root.partition("://")[2]
    # the client options above replace those obstore reads from the environment: keep this one
    prefix = {"s3": "AWS", "s3a": "AWS", "gs": "GOOGLE", "gcs": "GOOGLE"}.get(scheme, "AZURE")
    if os.environ.get(f"{prefix}_ALLOW_HTTP", "").lower() in ("1", "true"):
        kw["client_options"]["allow_http"] = True
    try:
        store = from_url(root, **kw)
    except Exception as exc:  # noqa: BLE001 - obstore's config errors have no common base we can name
        raise StoreError(f"{root}: cannot open the store ({_first_line(exc)})") from None
    with _lock:
        return _stores.setdefault(key, store)


def _has_aws_profile() -> bool:
    home = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", Path.home() / ".aws" / "credentials"))
    return bool(os.environ.get("AWS_PROFILE")) or home.is_file()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_CONCURRENCY, thread_name_prefix="dataprep-store")
        return _pool


def _first_line(exc: BaseException) -> str:
    """A store client's error as a few words: ``503 SlowDown``, ``connection reset``, ..."""
    full = str(exc).strip()
    text = full.splitlines()[0] if full else type(exc).__name__
    m = re.search(r"status code: (\d{3})", text)
    if m:
        code = re.search(r"<Code>([A-Za-z]+)</Code>", full)
        return f"{m.group(1)} {code.group(1) if code else text[m.end():].split(':')[0].strip()}"
    for pattern, words in _CAUSES:
        if re.search(pattern, full):
            return words
    return text.rsplit(" - ", 1)[-1][:200]


#: a transport fault's cause, found in the client's full error text, as the words shown
_CAUSES = (
    (r"kind: Timeout|TimedOut|timed out", "timed out"),
    (r"kind: Body|body error", "truncated body (the connection closed mid-body)"),
    (r"ConnectionReset|reset by peer", "connection reset"),
    (r"ConnectionRefused|Connection refused", "connection refused"),
)


class _Transient(Exception):
    """A fault worth another try (a short body, a dropped connection, a 5xx, a time-out)."""


def _permanent(exc: BaseException) -> StoreError | None:
    """The one line for an error no retry mends (absent, forbidden, changed, bad request), else None."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return StoreError("no such object")
    kind = type(exc).__name__
    if kind in ("PermissionDeniedError", "UnauthenticatedError"):
        return StoreError(f"access denied ({_first_line(exc)}); check the store's credentials")
    if kind == "PreconditionError":
        return StoreError("the object changed while being read (its ETag differs); rerun")
    if kind in ("InvalidPathError", "NotSupportedError", "UnknownConfigurationKeyError"):
        return StoreError(_first_line(exc))
    text = str(exc)
    if re.search(r"status code: 4\d\d", text) and not re.search(r"status code: (408|429)", text):
        return StoreError(_first_line(exc))
    return None


def _retrying(what: str, call: Any) -> Any:
    """``call()`` with :data:`RETRY`; every error ends as one :class:`StoreError` line naming ``what``."""
    last = "unknown error"
    for attempt in range(RETRY.attempts):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - a store client raises many kinds; each is sorted below
            bad = _permanent(exc)
            if bad is not None:
                raise StoreError(f"{what}: {bad}") from None
            last = _first_line(exc)
        if attempt + 1 < RETRY.attempts:
            time.sleep(min(RETRY.max_backoff_s, RETRY.backoff_s * 2 ** attempt))
    raise StoreError(f"{what}: {last} (gave up after {RETRY.attempts} attempts)")


# ----------------------------------------------------------------------------- reading
def stat(path: str | os.PathLike[str]) -> ObjectInfo:
    """Size, ETag and version of ``path`` (asked of the store each call; :func:`read_ranges`
    remembers the first answer per object and reads with ``If-Match`` against it)."""
    text = os.fspath(path)
    if not is_url(text):
        try:
            return ObjectInfo(os.stat(local_path(text)).st_size)
        except OSError as exc:
            raise StoreError(os_error_line(exc, text)) from None
    root, key = split_url(text)
    store = _store(root)
    obs = _obstore()
    meta = _retrying(text, lambda: obs.head(store, key))
    info = ObjectInfo(int(meta["size"]), meta.get("e_tag"), meta.get("version"))
    with _lock:
        _infos[text] = info
    return info


def known_info(path: str | os.PathLike[str]) -> ObjectInfo:
    """:func:`stat` of ``path``, or what this process remembers of it (a listing or an earlier
    ``HEAD``; a command starts from nothing remembered, :func:`forget_all`)."""
    text = os.fspath(path)
    with _lock:
        known = _infos.get(text)
    return known if known is not None else stat(text)


def forget(path: str | os.PathLike[str]) -> None:
    """Drop what this process remembers of ``path`` (its next read asks the store again)."""
    with _lock:
        _infos.pop(os.fspath(path), None)


def forget_all() -> None:
    """Drop what this process remembers of every object (a command starts afresh)."""
    with _lock:
        _infos.clear()


def coalesce(ranges: Sequence[tuple[int, int]], gap: int = DEFAULT_GAP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge ``(offset, length)`` ranges closer than ``gap`` bytes: ``(starts, ends, group)``,
    the merged ``[start, end)`` spans sorted by start and each input range's span index."""
    arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if len(arr) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    if (arr < 0).any():
        raise StoreError(f"negative offset or length in a byte range: {arr[(arr < 0).any(axis=1)][0].tolist()}")
    order = np.argsort(arr[:, 0], kind="stable")
    s, e = arr[order, 0], arr[order, 0] + arr[order, 1]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1] + gap
    gid_sorted = np.cumsum(new) - 1
    starts = s[new]
    ends = np.maximum.reduceat(e, np.flatnonzero(new))
    group = np.empty(len(arr), np.int64)
    group[order] = gid_sorted
    return starts, ends, group


def _get_span(path: str, start: int, end: int, info: ObjectInfo) -> bytes:
    """Bytes ``[start, end)`` of ``path``, retried; a short or changed body is a fault, never data."""
    if not is_url(path):
        try:
            fd = os.open(local_path(path), os.O_RDONLY)
        except OSError as exc:
            raise StoreError(os_error_line(exc, path)) from None
        try:
            data = os.pread(fd, end - start, start)
        except OSError as exc:
            raise StoreError(os_error_line(exc, path)) from None
        finally:
            os.close(fd)
        if len(data) != end - start:
            raise StoreError(f"{path}: short read ({len(data)} of {end - start} bytes at {start}; the file shrank?)")
        return data
    root, key = split_url(path)
    store = _store(root)
    obs = _obstore()
    options: dict[str, Any] = {"range": (start, end)}
    if info.etag:
        options["if_match"] = info.etag

    def once() -> bytes:
        res = obs.get(store, key, options=options)
        got = res.meta.get("e_tag")
        data = bytes(res.bytes())
        if len(data) != end - start:
            raise _Transient(f"short body ({len(data)} of {end - start} bytes at {start})")
        if info.etag and got and got != info.etag:
            raise StoreError("the object changed while being read (its ETag differs); rerun")
        return data

    try:
        return _retrying(path, once)
    except StoreError:
        forget(path)
        raise


def read_ranges(path: str | os.PathLike[str], ranges: Sequence[tuple[int, int]], *,
                gap: int = DEFAULT_GAP, info: ObjectInfo | None = None) -> list[bytes]:
    """The bytes of each ``(offset, length)`` range of ``path``, in the order given. Ranges
    closer than ``gap`` bytes are one request; a call's requests run in parallel (at most
    :data:`MAX_CONCURRENCY`). ``info`` (from :func:`stat`, e.g. when the ranges came from an
    index of that object) pins the ETag read; a range past the end is an error."""
    text = os.fspath(path)
    info = info if info is not None else known_info(text)
    starts, ends, group = coalesce(ranges, gap)
    if len(ends) and int(ends.max()) > info.size:
        raise StoreError(f"{text}: byte range ends at {int(ends.max())}, past the object's end ({info.size} bytes)")
    if len(starts) > 1:
        spans = list(_executor().map(lambda se: _get_span(text, se[0], se[1], info),
                                     zip(starts.tolist(), ends.tolist())))
    else:
        spans = [_get_span(text, int(a), int(b), info) for a, b in zip(starts, ends)]
    out = []
    for (off, length), g in zip(ranges, group.tolist()):
        rel = off - int(starts[g])
        out.append(spans[g][rel:rel + length])
    return out


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole of ``path`` (checked for length and ETag)."""
    text = os.fspath(path)
    info = stat(text)
    return read_ranges(text, [(0, info.size)], info=info)[0] if info.size else b""


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an existing file or object."""
    text = os.fspath(path)
    if not is_url(text):
        return os.path.exists(local_path(text))
    try:
        known_info(text)
    except StoreError as exc:
        if str(exc).endswith("no such object"):
            return False
        raise
    return True


def is_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a local folder, or a URL prefix holding at least one object."""
    text = os.fspath(path)
    if not is_url(text):
        return os.path.isdir(local_path(text))
    root, key = split_url(text)
    store = _store(root)
    obs = _obstore()

    def once() -> bool:
        return any(bool(chunk) for chunk in obs.list(store, prefix=key.rstrip("/") + "/", chunk_size=1))

    return bool(_retrying(text, once))


def exists_or_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a file, an object, a folder or a non-empty URL prefix."""
    return exists(path) or is_folder(path)


def list_prefix(prefix: str) -> list[tuple[str, ObjectInfo]]:
    """Every object under a URL prefix (``s3://b/folder/``), sorted by URL, with its info."""
    root, key = split_url(prefix)
    store = _store(root)
    obs = _obstore()

    def once() -> list[dict[str, Any]]:
        return [m for chunk in obs.list(store, prefix=key or None) for m in chunk]

    metas = _retrying(prefix, once)
    out = sorted((f"{root}/{m['path']}", ObjectInfo(int(m["size"]), m.get("e_tag"), m.get("version")))
                 for m in metas)
    with _lock:
        _infos.update(out)
    return out


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of an object whose every read is one range request."""

    def __init__(self, path: str, info: ObjectInfo, offset: int = 0, size: int | None = None,
                 later: bool = False, head: int = 0) -> None:
        self.path, self.info, self.pos, self.base, self.later = path, info, 0, offset, later
        self.size = info.size - offset if size is None else size
        self.name = path
        self.error: StoreError | None = None
        n = min(head, self.size)  # read now, in the caller's thread: a C reader's callbacks run one at a time
        self.head = _get_span(path, offset, offset + n, info) if n > 0 else b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf: Any) -> int:
        n = max(0, min(len(buf), self.size - self.pos, self.info.size - self.base - self.pos))
        if n == 0:
            return 0
        if self.pos < len(self.head):
            n = min(n, len(self.head) - self.pos)
            buf[:n] = self.head[self.pos:self.pos + n]
            self.pos += n
            return n
        start = self.base + self.pos
        try:
            data = _get_span(self.path, start, start + n, self.info)
        except StoreError as exc:
            self.error = exc
            if self.later:  # a C reader calling back (soundfile) would print it: check_reads raises it
                return 0
            raise
        buf[:n] = data
        self.pos += n
        return n


def check_reads(fh: Any) -> None:
    """Raise the store error a read of ``fh`` (from :func:`open_input` / :func:`open_range`) met,
    if any: a C library reading through callbacks (soundfile) turns it into a short read."""
    err = getattr(getattr(fh, "raw", None), "error", None)
    if err is not None:
        raise err


def open_range(path: str, offset: int, size: int, buffer_size: int = 64 * 1024, *,
               errors_later: bool = False, head: int = 0) -> IO[bytes]:
    """A binary, seekable file of the ``size`` bytes at ``offset`` of the URL ``path`` (a tar
    member), read by range requests of ``buffer_size`` bytes, pinned to the object's ETag.
    ``errors_later``, ``head``: as :func:`open_input`'s."""
    return io.BufferedReader(_RangeFile(path, known_info(path), offset, size, errors_later, head),
                             buffer_size=buffer_size)


def open_input(path: str | os.PathLike[str], buffer_size: int = 64 * 1024, *,
               errors_later: bool = False, head: int = 0) -> IO[bytes]:
    """A binary, seekable file of ``path``: a local file opened, a URL read by range requests
    of ``buffer_size`` bytes (what soundfile needs to probe a header, never the whole object).
    ``errors_later``: a failed read returns no bytes and :func:`check_reads` raises its error
    (for a C reader that calls back, e.g. soundfile: an exception there would be swallowed).
    ``head``: the first ``head`` bytes are read at once, here (soundfile's read callbacks run
    one at a time across threads: reads inside them would serialise parallel probes)."""
    text = os.fspath(path)
    if not is_url(text):
        try:
            return open(local_path(text), "rb")
        except OSError as exc:
            raise StoreError(os_error_line(exc, text)) from None
    return io.BufferedReader(_RangeFile(text, known_info(text), later=errors_later, head=head), buffer_size=buffer_size)


# ----------------------------------------------------------------------------- writing
@contextlib.contextmanager
def write_atomic(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a local temporary path to write ``path``'s content into; on success it becomes
    ``path`` whole (a local rename, :func:`manifests.atomic_files.atomic_path`, or an upload
    completed only when every byte is there); on an error nothing is published."""
    text = os.fspath(path)
    from manifests.atomic_files import atomic_path
    if not is_url(text):
        with atomic_path(local_path(text), fsync=fsync) as tmp:
            yield tmp
        return
    fd, tmp_name = tempfile.mkstemp(prefix=f"dataprep-{os.getpid()}.", suffix=".upload.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        upload(tmp, text)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def upload(local: str | os.PathLike[str], url: str, chunk: int = 8 << 20) -> ObjectInfo:
    """Copy a local file to ``url`` (a multipart upload for more than ``chunk`` bytes, aborted on
    any error, so the object appears only whole), retried; the stored size is checked."""
    root, key = split_url(url)
    store = _store(root)
    obs = _obstore()
    size = os.path.getsize(local)

    def once() -> None:
        with open(local, "rb") as src, obs.open_writer(store, key, buffer_size=chunk) as w:
            shutil.copyfileobj(src, w, chunk)

    _retrying(url, once)
    forget(url)
    info = stat(url)
    if info.size != size:
        raise StoreError(f"{url}: stored {info.size} bytes of {size}; the upload did not complete")
    return info


@contextlib.contextmanager
def open_output(path: str | os.PathLike[str], *, chunk: int = 8 << 20) -> Iterator[IO[bytes]]:
    """A binary stream for ``path``: a local temporary file renamed over it on success, or an
    object uploaded in ``chunk``-byte parts and completed only on success (aborted on any
    error, so a killed or failed writer leaves no object that looks whole)."""
    text = os.fspath(path)
    if not is_url(text):
        with write_atomic(text) as tmp, open(tmp, "wb") as fh:
            yield fh
        return
    root, key = split_url(text)
    store = _store(root)
    obs = _obstore()
    try:
        writer = obs.open_writer(store, key, buffer_size=chunk)
    except Exception as exc:  # noqa: BLE001
        raise StoreError(f"{text}: {_first_line(exc)}") from None
    try:
        with writer:  # an exception aborts the multipart upload: no object appears
            yield writer  # type: ignore[misc]
    except Exception as exc:
        if type(exc).__module__.startswith("obstore"):  # the store's own failure: one line naming the object
            raise StoreError(f"{text}: {_first_line(exc)} (nothing was written)") from None
        raise
    forget(text)


def remove(path: str | os.PathLike[str]) -> None:
    """Delete ``path`` (absent is fine)."""
    text = os.fspath(path)
    if not is_url(text):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local_path(text))
        return
    root, key = split_url(text)
    store = _store(root)
    obs = _obstore()
    _retrying(text, lambda: obs.delete(store, key))
    forget(text)
