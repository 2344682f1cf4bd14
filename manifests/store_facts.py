"""Facts about store objects, gathered cheaply and remembered by ETag / version.

:func:`infos`: size, ETag and version of many URLs by one listing per folder (a thousand
objects an answer) instead of a ``HEAD`` each; :func:`fetch_local`: a verified local copy of an
object, kept under its ETag; :func:`fingerprint`: a SHA-256 naming what a URL holds (URL, size, ETag, version of an object or of every object under a folder) without reading
it; :func:`cache_get` / :func:`cache_put`: JSON facts computed from an object's bytes (an audio
header, a tar index), in SQLite under :func:`manifests.hash_cache.default_cache_dir`, keyed by
URL and ETag / version, so a changed object misses and a rerun reads nothing it has seen.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from manifests import storage

_db_lock = threading.Lock()
_cache_db: Any = None


def close() -> None:
    """Close the cache (reopened at the next use, under the cache folder then in force)."""
    global _cache_db
    with _db_lock:
        if _cache_db is not None:
            _cache_db.close()
            _cache_db = None


storage.ON_RESET.append(close)


def fingerprint(path: str) -> str:
    """SHA-256 naming what a URL holds without reading it: an object's (URL, size, ETag,
    version), a folder's the same for each object under it."""
    import hashlib
    items = [(path, storage.known_info(path))] if storage.exists(path) else storage.list_prefix(path.rstrip("/") + "/")
    text = "\n".join(f"{u}\0{i.size}\0{i.etag}\0{i.version}" for u, i in items)
    return hashlib.sha256(text.encode()).hexdigest()



#: keys a listing answer holds (S3, GCS and Azure alike)
LIST_PAGE = 1000
#: fewest members a key range of a folder's listing is split for (a sample of 1,000 files spread
#: over a folder of 100,000: 15 ranges listed at once, not 100 answers one after another)
RANGE_MEMBERS = 64


def infos(urls: Sequence[str]) -> dict[str, storage.ObjectInfo | None]:
    """Size, ETag and version of many URLs in few requests: one listing per folder they share
    (a thousand objects an answer; for many members, in key ranges split at the members'
    quantiles, listed at once), ``None`` for an object that does not exist."""
    out: dict[str, storage.ObjectInfo | None] = {}
    folders: dict[str, set[str]] = {}
    for u in urls:
        folders.setdefault(storage.parent(u), set()).add(u)
    for folder, members in folders.items():
        root, key = storage.split_url(folder + "/x")
        listed = _list_folder(root, key[:-1], sorted(m[len(root) + 1:] for m in members))
        with storage._lock:
            storage._infos.update(listed)
        out.update({u: listed.get(u) for u in members})
    return out


def _list_folder(root: str, prefix: str, keys: list[str]) -> dict[str, storage.ObjectInfo]:
    """The objects of the folder ``prefix`` of ``root`` that ``keys`` (sorted) need: one listing,
    or, for :data:`RANGE_MEMBERS` keys a range or more, ranges between them listed concurrently
    (each from the last key of the range before it, up to its own last key)."""
    obs = storage._obstore()
    store = storage._store(root)
    parts = min(storage.MAX_CONCURRENCY, len(keys) // RANGE_MEMBERS)
    ends: list[str | None] = [keys[len(keys) * (i + 1) // parts - 1] for i in range(parts - 1)] + [None] \
        if parts > 1 else [None]
    starts: list[str | None] = [None, *ends[:-1]]

    def one(start: str | None, end: str | None) -> list[dict[str, Any]]:
        def once() -> list[dict[str, Any]]:
            if start is None and end is None:
                return list(obs.list_with_delimiter(store, prefix=prefix or None)["objects"])
            got: list[dict[str, Any]] = []
            for chunk in obs.list(store, prefix=prefix or None, offset=start, chunk_size=LIST_PAGE):
                got.extend(m for m in chunk if end is None or m["path"] <= end)
                if end is not None and chunk and chunk[-1]["path"] >= end:
                    break
            return got
        return storage._retrying(f"{root}/{prefix}/", once)

    with ThreadPoolExecutor(len(ends), thread_name_prefix="dataprep-list") as pool:
        metas = [m for part in pool.map(one, starts, ends) for m in part]
    return {f"{root}/{m['path']}": storage.ObjectInfo(int(m["size"]), m.get("e_tag"), m.get("version"))
            for m in metas}


def _cache() -> Any:
    """The store cache (SQLite under :func:`manifests.hash_cache.default_cache_dir`): facts
    computed from an object's bytes, keyed by URL and ETag / version (a changed object misses)."""
    global _cache_db
    with _db_lock:
        if _cache_db is None:
            import sqlite3
            from manifests.hash_cache import default_cache_dir
            folder = default_cache_dir()
            folder.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(folder / "store-cache.sqlite", timeout=60, check_same_thread=False,
                                 isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")  # a fact a commit, without an fsync each (22 ms -> ~0.1)
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS facts (kind TEXT, url TEXT, tag TEXT, value TEXT, "
                       "PRIMARY KEY (kind, url, tag))")
            _cache_db = db
        return _cache_db


def _tag(info: storage.ObjectInfo) -> str | None:
    return info.version or info.etag


def cache_get(kind: str, url: str, info: storage.ObjectInfo) -> Any:
    """The JSON value stored for ``(kind, url)`` at this ETag / version, else ``None``."""
    import json
    tag = _tag(info)
    if tag is None:
        return None
    db = _cache()
    with _db_lock:
        row = db.execute("SELECT value FROM facts WHERE kind=? AND url=? AND tag=?", (kind, url, tag)).fetchone()
    return json.loads(row[0]) if row else None


def cache_put(kind: str, url: str, info: storage.ObjectInfo, value: Any) -> None:
    """Remember ``value`` (JSON) for ``(kind, url)`` at this ETag / version."""
    import json
    tag = _tag(info)
    if tag is None:
        return
    db = _cache()
    with _db_lock:
        db.execute("INSERT OR REPLACE INTO facts VALUES (?, ?, ?, ?)", (kind, url, tag, json.dumps(value)))


def fetch_local(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A local file holding ``path``'s bytes: a local path itself; a URL's object downloaded
    once into ``<cache_dir>/objects/`` under its ETag (a rerun on an unchanged object reads only
    its ``HEAD``), checked for length before it is kept."""
    text = os.fspath(path)
    if not storage.is_url(text):
        return Path(storage.local_path(text))
    from manifests.atomic_files import atomic_path
    import hashlib
    from manifests.hash_cache import default_cache_dir
    info = storage.known_info(text)
    tag = info.version or info.etag or f"size{info.size}"
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = folder / "objects" / f"{hashlib.sha256(f'{text}|{tag}'.encode()).hexdigest()[:32]}-{storage.name(text)[-80:]}"
    if dest.is_file() and dest.stat().st_size == info.size:
        return dest
    step = 16 << 20
    with atomic_path(dest, fsync=False) as tmp, open(tmp, "wb") as out:
        for off in range(0, info.size, step * 4):
            ranges = [(o, min(step, info.size - o)) for o in range(off, min(info.size, off + step * 4), step)]
            for chunk in storage.read_ranges(text, ranges, gap=0, info=info):
                out.write(chunk)
    return dest
