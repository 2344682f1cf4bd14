"""Verified content hashes of files we wrote, remembered by the file's cheap facts; the one
cache directory; small values kept by context (:func:`keep_value`: OOM probes, the report's script).

A recorded hash is trusted only once the rows were seen to hash to it; the verification is
remembered under ``<cache>/content-hash/`` by the file's size, mtime and footer SHA-256
(:func:`file_facts`), so an unchanged file is checked in about a millisecond.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from manifests.atomic_files import file_lock, write_json
from manifests.content_hash import recompute_hash
from manifests.errors import ManifestError
from manifests.manifest_read import check_manifest_file, recorded_hash


def default_cache_dir() -> Path:
    """``$SPEECH_DATAPREP_CACHE`` or ``$XDG_CACHE_HOME/speech-dataprep`` (``~/.cache`` by default)."""
    env = os.environ.get("SPEECH_DATAPREP_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speech-dataprep"


def context_key(context: Mapping[str, Any]) -> str:
    """SHA-256 (hex, 24 chars) of the canonical JSON of ``context``: the name of what is kept for it."""
    return hashlib.sha256(json.dumps(dict(context), sort_keys=True).encode()).hexdigest()[:24]


def kept_value(folder: str | os.PathLike[str] | None, context: Mapping[str, Any], field: str = "value") -> Any:
    """What :func:`keep_value` kept in ``folder`` for ``context`` under ``field``, or None (no
    folder, none kept, another context under the same name, a corrupt file: a miss, never an error)."""
    if folder is None:
        return None
    try:
        data = json.loads((Path(folder) / f"{context_key(context)}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get(field) if isinstance(data, dict) and data.get("context") == context else None


def keep_value(folder: str | os.PathLike[str] | None, context: Mapping[str, Any], value: Any,
               field: str = "value") -> None:
    """Keep a JSON ``value`` for ``context`` under ``field``, atomically (nothing without a folder):
    one file per context, ``{"context": ..., field: value}``."""
    if folder is not None:
        write_json({"context": dict(context), field: value}, Path(folder) / f"{context_key(context)}.json")


def file_facts(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Cheap facts that change whenever a Parquet file's bytes do: size, mtime (ns) and the
    SHA-256 of its footer (schema, metadata, row-group offsets and statistics)."""
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            if st.st_size < 12:
                raise ManifestError(f"{path}: not a Parquet file ({st.st_size} bytes)")
            fh.seek(st.st_size - 8)
            tail = fh.read(8)
            footer_len = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or footer_len > st.st_size - 12:
                raise ManifestError(f"{path}: not a Parquet file (no footer)")
            fh.seek(st.st_size - 8 - footer_len)
            footer = hashlib.sha256(fh.read(footer_len + 8)).hexdigest()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: is a directory, not a Parquet file") from None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "footer_sha256": footer}


_VERIFIED: dict[str, str] = {}  # facts -> hash, this process, for the default cache directory only


def _facts_key(facts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(facts), sort_keys=True).encode()).hexdigest()[:32]


def _verified_entry(facts: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None) -> Path:
    store = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return store / "content-hash" / f"{_facts_key(facts)}.json"


def remember_verified(path: str | os.PathLike[str], content_hash: str,
                      cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Record that the file now at ``path`` (by its facts, :func:`file_facts`) holds rows hashing
    to ``content_hash``: the writer knows it, so the first check of a file we wrote is free.
    A rename keeps the facts; any rewrite changes them. Written under ``cache_dir`` only
    (None: :func:`default_cache_dir`, resolved now, and this process's memory)."""
    facts = file_facts(path)
    if cache_dir is None:
        _VERIFIED[_facts_key(facts)] = content_hash
    with contextlib.suppress(OSError):  # a read-only cache only costs a recomputation later
        write_json({"facts": facts, "content_hash": content_hash}, _verified_entry(facts, cache_dir))


def manifest_hash(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The content hash of a file we wrote, VERIFIED: the recorded hash is trusted only when the
    rows hash to it. A verification is remembered by the file's facts (size, mtime, footer
    SHA-256; :func:`file_facts`) under ``<cache_dir>/content-hash/`` (writers record theirs), so
    an unchanged file is checked in about a millisecond and a changed one is recomputed
    (:func:`recompute_hash`). A file whose rows no longer match its recorded hash (edited with
    its metadata kept) is refused. ``cache_dir`` None: :func:`default_cache_dir` (resolved at
    each call) plus an in-process memo; a given ``cache_dir`` is the only place read or
    written (no memo shared with other directories)."""
    facts = file_facts(path)
    key = _facts_key(facts)
    memo = _VERIFIED if cache_dir is None else {}
    entry = _verified_entry(facts, cache_dir)
    # the facts hold the footer's SHA-256, so a verified entry's hash IS the one recorded there:
    # the footer (megabytes at a billion rows) is parsed only when no verification matches
    known = memo.get(key) or _cached_verification(entry, facts, None)
    if known:
        memo[key] = known
        return known
    recorded = recorded_hash(path)
    if not recorded:
        raise ManifestError(f"{path}: no content hash in its metadata (write it with `dataprep compile`)")
    # ranks of one machine opening the same copied manifest: one recomputes, the others wait
    # for its verification instead of hashing every row again
    with file_lock(entry.parent.with_name("content-hash-locks") / f"{entry.stem}.lock"):
        if _cached_verification(entry, facts, recorded):
            memo[key] = recorded
            return recorded
        got = recompute_hash(path)
        if got != recorded:
            raise ManifestError(_rows_differ(path, recorded, got))
        remember_verified(path, got, cache_dir)
    return got


def _cached_verification(entry: Path, facts: Mapping[str, Any], recorded: str | None) -> str:
    """The hash ``entry`` says these facts were verified to hash to (``recorded``, when given), else ""."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        cached = json.loads(entry.read_text(encoding="utf-8"))
        got = cached.get("content_hash")
        if cached.get("facts") == facts and isinstance(got, str) and got and recorded in (None, got):
            return got
    return ""


def require_manifest_hash(path: str | os.PathLike[str], expected: str, what: str) -> None:
    """Refuse ``path`` unless its content hash is ``expected`` (``what`` names the owner of
    the expectation in the one-line error, e.g. "the plan's manifest")."""
    got = manifest_hash(path)
    if got != expected:
        raise ManifestError(f"{path}: content hash {got[:12]}... differs from {what} ({expected[:12]}...)")


def verify_manifest_rows(path: str | os.PathLike[str], expected: str, what: str) -> None:
    """Refuse ``path`` unless every row, read block by block (:func:`recompute_hash`; cached
    facts are not trusted), hashes both to the hash its metadata records and to ``expected``
    (``what`` names the owner of that expectation, e.g. "the plan's manifest"). Memory: one
    block of rows. A file that passes is remembered as verified (:func:`remember_verified`)."""
    recorded = str(check_manifest_file(path)["content_hash"])
    if not recorded:
        raise ManifestError(f"{path}: no content hash in its metadata (write it with `dataprep compile`)")
    got = recompute_hash(path)
    if got != recorded:
        raise ManifestError(_rows_differ(path, recorded, got))
    if got != expected:
        raise ManifestError(f"{path}: content hash {got[:12]}... differs from {what} ({expected[:12]}...)")
    remember_verified(path, got)


def _rows_differ(path: str | os.PathLike[str], recorded: str, got: str) -> str:
    return (f"{path}: content_hash: the metadata records {recorded[:12]}... but the rows hash "
            f"to {got[:12]}... (edited after it was written? re-run the command that wrote it)")
