"""Audio header probing: duration, sample rate and channels without decoding audio.

``soundfile.info`` reads only the header (frames / sample rate), never the samples. For
MP3, libsndfile reports the header's length, which can exceed the decoded length by the
encoder delay/padding (e.g. 2.380 s in the header vs 2.376 s decoded for a 48 kHz clip):
the header figure is what we store, documented as a tolerance of a few milliseconds.

Audio inside containers (:func:`probe_members`) is probed in place: a tar member through a
read-only view of its byte range (``pread``; nothing extracted, only the header's bytes read),
a Hugging Face Parquet row from the bytes the reader already holds.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl
import soundfile

from manifests import storage, store_facts
from manifests.audio import not_regular
from manifests.containers import RangeFile
from manifests.store_paths import SCHEMES

#: ``info(path)`` returns an object with ``frames``, ``samplerate`` and ``channels``.
HeaderReader = Callable[[str], Any]

PROBE_SCHEMA: dict[str, pl.DataType] = {
    "audio_path": pl.String(),
    "file_duration": pl.Float64(),
    "sample_rate": pl.Int32(),
    "channels": pl.Int16(),
    "probe_reason": pl.String(),
    "probe_detail": pl.String(),
}


#: frames read back from the end of each file to verify its length (``verify_length``)
TAIL_FRAMES = 4096


_SHORT_CHUNK = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_UNKNOWN_SIZES = {0, 0xFFFFFFFF, 0x7FFFFFFF}  # placeholders of streamed writers, not a claim


@contextlib.contextmanager
def _source(path: str) -> Iterator[Any]:
    """What soundfile opens for ``path``: the path, or a URL's range-reading file; a store error
    met inside soundfile's reads is raised on the way out, never taken for bad audio."""
    if not storage.is_url(path):
        yield path
        return
    fh = storage.open_input(path, 16 << 10, errors_later=True, head=16 << 10)
    try:
        yield fh
    except (soundfile.LibsndfileError, RuntimeError, ValueError):
        storage.check_reads(fh)
        raise
    finally:
        storage.check_reads(fh)
        fh.close()


def _url_info(url: str, info: HeaderReader) -> Any:
    """``info`` of a URL's header, read by range requests."""
    with _source(url) as fh:
        return info(fh)


def _short_data_chunk(path: str) -> str | None:
    """For WAV-like files libsndfile silently shortens ``frames`` to what is there; its verbose
    header log still says ``data : <declared> (should be <present>)``: that file is truncated."""
    with _source(path) as src:
        m = _SHORT_CHUNK.search(soundfile.info(src, verbose=True).extra_info or "")
    if m and int(m.group(2)) < int(m.group(1)) and int(m.group(1)) not in _UNKNOWN_SIZES:
        return f"its data chunk declares {int(m.group(1)):,} bytes but holds {int(m.group(2)):,}"
    return None


def _frames_readable(path: str, frames: int) -> int:
    """Frames actually decodable at the end of a file whose header says ``frames``: seek to the
    last :data:`TAIL_FRAMES` and read them (a truncated file has fewer, or fails to seek)."""
    with _source(path) as src, soundfile.SoundFile(src) as f:
        start = max(0, frames - TAIL_FRAMES)
        f.seek(start)
        got = f.read(frames - start, dtype="int16", always_2d=True).shape[0]
    return start + got


def _probe_one(path: str, info: HeaderReader, verify_length: bool = False) -> tuple[
        str, float | None, int | None, int | None, str | None, str | None]:
    url = storage.is_url(path)
    problem = None if url else not_regular(path)
    if problem is not None:
        return path, None, None, None, "unreadable_audio", f"{path}: {problem}"
    try:
        hdr = _url_info(path, info) if url else info(path)
    except storage.StoreError as exc:
        if str(exc).endswith("no such object"):
            return path, None, None, None, "missing_audio", f"{path}: audio object not found"
        raise  # the store failed after its retries: one line, the compile stops
    except FileNotFoundError:
        return path, None, None, None, "missing_audio", f"{path}: audio file not found"
    except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not os.path.exists(path):
            return path, None, None, None, "missing_audio", f"{path}: audio file not found"
        return path, None, None, None, "unreadable_audio", f"{path}: unreadable audio header ({msg})"
    frames, rate = int(hdr.frames), int(hdr.samplerate)
    if rate <= 0 or frames <= 0:
        return path, None, rate or None, int(hdr.channels) or None, "unreadable_audio", (
            f"{path}: header reports {frames} frames at {rate} Hz"
        )
    if verify_length:
        try:
            short = _short_data_chunk(path)
            if short is not None:
                return path, None, rate, int(hdr.channels), "truncated_audio", f"{path}: truncated file ({short})"
            real = _frames_readable(path, frames)
        except storage.StoreError:
            raise
        except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return path, None, rate, int(hdr.channels), "truncated_audio", (
                f"{path}: header says {frames / rate:.3f} s but the end cannot be decoded ({msg})")
        if real < frames:
            return path, None, rate, int(hdr.channels), "truncated_audio", (
                f"{path}: header says {frames / rate:.3f} s but only {real / rate:.3f} s decode (truncated file)")
    return path, frames / rate, rate, int(hdr.channels), None, None


#: header reads in flight by default: on local disk, and in a store (each read waits a round trip)
LOCAL_PROBE_THREADS = 8
STORE_PROBE_THREADS = 64
_STORE_URL = "^(?i:" + "|".join(sorted(SCHEMES)) + ")://"


def probe_thread_count(threads: int, paths: pl.Series) -> int:
    """``threads``, or where 0 (the default): :data:`STORE_PROBE_THREADS` when any of ``paths``
    (audio files or containers) is in a store, else :data:`LOCAL_PROBE_THREADS`."""
    if threads:
        return threads
    return STORE_PROBE_THREADS if paths.str.contains(_STORE_URL).any() else LOCAL_PROBE_THREADS


def probe_headers(
    paths: Sequence[str],
    *,
    threads: int = 8,
    info: HeaderReader = soundfile.info,
    on_progress: Callable[[int], None] | None = None,
    verify_length: bool = False,
) -> pl.DataFrame:
    """Read the header of each distinct path; one row per path, in the order given.

    Columns: ``audio_path``, ``file_duration`` (s), ``sample_rate`` (Hz), ``channels``,
    ``probe_reason`` / ``probe_detail`` (null when the header was read; else
    ``missing_audio`` or ``unreadable_audio`` and a one-line message naming the file).
    ``verify_length`` (``--probe always``) also decodes the last frames the header promises
    (reason ``truncated_audio`` when they are missing). Paths that are not regular files (a
    FIFO, a directory, a device) are never opened (``unreadable_audio``).
    Header reads are I/O bound, so threads overlap them; results are ordered, so the
    output does not depend on the thread count.
    """
    known = _cached_url_probes(paths, verify_length)

    def one(p: str) -> tuple[str, float | None, int | None, int | None, str | None, str | None]:
        if p in known:
            return known[p]
        res = _probe_one(p, info, verify_length)
        if p in _URL_INFOS and res[4] is None:
            store_facts.cache_put(_probe_kind(verify_length), p, _URL_INFOS[p], list(res))
        return res

    results = []
    if threads <= 1:
        for p in paths:
            results.append(one(p))
            if on_progress:
                on_progress(1)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for res in pool.map(one, paths, chunksize=64):
                results.append(res)
                if on_progress:
                    on_progress(1)
    return pl.DataFrame(results, schema=PROBE_SCHEMA, orient="row")


#: the ObjectInfo of each URL probed in this process (the key its header is cached under)
_URL_INFOS: dict[str, storage.ObjectInfo] = {}


def _probe_kind(verify_length: bool) -> str:
    return "probe-verified" if verify_length else "probe"


def _cached_url_probes(paths: Sequence[str], verify_length: bool) -> dict[str, tuple[Any, ...]]:
    """Headers of the audio URLs among ``paths`` read before (cached by object ETag / version:
    a rerun lists each folder once and reads no audio); missing objects answered at once."""
    urls = [p for p in dict.fromkeys(paths) if storage.is_url(p)]
    if not urls:
        return {}
    out: dict[str, tuple[Any, ...]] = {}
    for url, obj in store_facts.infos(urls).items():
        if obj is None:
            continue  # probed: HEAD tells a missing object from a listing's miss (another folder depth)
        _URL_INFOS[url] = obj
        hit = store_facts.cache_get(_probe_kind(verify_length), url, obj)
        if hit is not None:
            out[url] = tuple(hit)
    return out


def _info_of(name: str, source: Any) -> tuple[str, float | None, int | None, int | None, str | None, str | None]:
    """Header of an in-memory or ranged audio source; ``name`` labels it in messages."""
    try:
        hdr = soundfile.info(source)
    except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError, TypeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        msg = re.sub(r"^Error opening <[^>]*>: ", "", msg)  # the file object's repr says nothing
        return name, None, None, None, "unreadable_audio", f"{name}: unreadable audio header ({msg})"
    frames, rate = int(hdr.frames), int(hdr.samplerate)
    if rate <= 0 or frames <= 0:
        return name, None, rate or None, int(hdr.channels) or None, "unreadable_audio", (
            f"{name}: header reports {frames} frames at {rate} Hz")
    return name, frames / rate, rate, int(hdr.channels), None, None


def _member_url(name: str, container: str, offset: int, size: int, info: storage.ObjectInfo) -> tuple[Any, ...]:
    """Header of a tar member in a store, cached under the tar's ETag / version (``info``)."""
    key = f"{container}#{offset}+{size}"
    hit = store_facts.cache_get("member-probe", key, info)
    if hit is not None:
        return (name, *hit[1:])
    fh = storage.open_range(container, offset, size, 16 << 10, errors_later=True, head=16 << 10)
    res = _info_of(name, fh)
    storage.check_reads(fh)
    if res[4] is None:
        store_facts.cache_put("member-probe", key, info, list(res))
    return res


def probe_members(
    rows: pl.DataFrame, *, threads: int = 8, on_progress: Callable[[int], None] | None = None
) -> pl.DataFrame:
    """Headers of audio inside containers, one row per row of ``rows`` (same schema as
    :func:`probe_headers`, keyed by ``audio_path``).

    ``rows`` has ``audio_path``, ``container``, ``member_offset``, ``member_size`` and optionally
    ``__audio_bytes``: rows with bytes are probed from them, the others through a
    :class:`~manifests.containers.RangeFile` over the tar member (each tar opened once).
    """
    names = rows["audio_path"].to_list()
    data = rows["__audio_bytes"].to_list() if "__audio_bytes" in rows.columns else [None] * rows.height
    containers = rows["container"].to_list()
    offsets = rows["member_offset"].to_list()
    sizes = rows["member_size"].to_list()
    fds: dict[str, int] = {}
    missing: set[str] = set()
    stats: dict[str, storage.ObjectInfo] = {}
    for c in {c for c in containers if c is not None and storage.is_url(c)}:
        if storage.exists(c):
            stats[c] = storage.stat(c)
        else:
            missing.add(c)
    for c, b in zip(containers, data):
        if b is None and c is not None and c not in fds and c not in missing and not storage.is_url(c):
            try:
                fds[c] = os.open(c, os.O_RDONLY)
            except OSError:
                missing.add(c)

    def one(i: int) -> tuple[str, float | None, int | None, int | None, str | None, str | None]:
        name = names[i]
        if data[i] is not None:
            return _info_of(name, io.BytesIO(data[i]))
        c = containers[i]
        if c in missing or c is None or offsets[i] is None:
            return name, None, None, None, "missing_audio", f"{name}: container not found"
        if storage.is_url(c):  # range reads of the member's header (never the member, never the tar)
            return _member_url(name, c, int(offsets[i]), int(sizes[i]), stats[c])
        return _info_of(name, RangeFile(fds[c], int(offsets[i]), int(sizes[i])))

    results = []
    try:
        if threads <= 1:
            it = map(one, range(rows.height))
        else:
            pool = ThreadPoolExecutor(max_workers=threads)
            it = pool.map(one, range(rows.height), chunksize=64)
        for res in it:
            results.append(res)
            if on_progress:
                on_progress(1)
        if threads > 1:
            pool.shutdown()
    finally:
        for fd in fds.values():
            os.close(fd)
    return pl.DataFrame(results, schema=PROBE_SCHEMA, orient="row")
