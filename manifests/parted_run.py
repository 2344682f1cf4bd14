"""A job split into parts (compile's hashed parts, pack's containers): completion markers, resume, refusal of mixed runs.

One :class:`PartedRun` is a folder of markers, a fingerprint (everything that changes the
output) and a number of parts. Part ``i`` of ``n`` is done when its marker
``part-0000i-of-0000n.done.json`` records this fingerprint and the SHA-256 of each of its files
as they are now (a hash recorded is never trusted: the file is hashed again). Files are written
first (atomically), the marker last, so a killed part leaves no marker and is redone.

Marker (JSON): ``version`` (1), ``part_index``, ``num_parts``, ``fingerprint_id`` (SHA-256 of the
fingerprint's canonical JSON), ``fingerprint``, ``files`` ({name: SHA-256}), the job's own keys;
also read: keys ``shard_index`` / ``num_shards`` and pack's names ``shard-0000i-of-0000n.done.json``.

The checks of a split (number of parts, part index, worker count) live here only
(:func:`check_split`), with the flags' names in their one-line errors.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from manifests.atomic_files import write_json
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError, OptionError
from manifests.options import check_int

MARKER_VERSION = 1
#: marker file-name prefixes: the first is written, every one is read (``shard``: pack before the rename)
_PREFIXES = ("part", "shard")


def check_split(num_parts: int | None = None, part_index: int | None = None, *, workers: int | None = None,
                max_parts: int | None = None, max_what: str = "") -> None:
    """Refuse (one line naming the flag, worded as the CLI's range checks) ``--workers`` < 1,
    ``--num-parts`` < 1 (or above ``max_parts``, e.g. the number of rows: ``max_what`` names it) and ``--part-index`` outside
    ``[0, num_parts)``. ``None`` = not given; bools and floats are refused, never coerced."""
    for flag, value, lowest in (("--workers", workers, 1), ("--num-parts", num_parts, 1), ("--part-index", part_index, 0)):
        try:  # named by the flag itself, whoever calls (a command, or a library caller)
            check_int(flag, value, ge=lowest, le=None, optional=True)
        except OptionError as exc:
            raise DataprepError(str(exc)) from None
    if num_parts is not None and max_parts is not None and num_parts > max_parts:
        raise DataprepError(f"--num-parts: must be <= {max_what or 'the maximum'} ({max_parts}), got {num_parts}")
    if part_index is not None and num_parts is not None and part_index >= num_parts:
        raise DataprepError(f"--part-index {part_index} is not in [0, {num_parts}) (--num-parts {num_parts})")


def fingerprint_id(fp: dict[str, Any]) -> str:
    """SHA-256 of the fingerprint's canonical JSON."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


def part_name(part_index: int, num_parts: int, prefix: str = _PREFIXES[0]) -> str:
    """``part-00003-of-00064`` (the stem of a part's marker, and of compile's part files)."""
    return f"{prefix}-{part_index:05d}-of-{num_parts:05d}"


def _differs(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(keys) or "fingerprint"


def read_marker(path: Path) -> dict[str, Any]:
    """A completion marker, old or new keys, as ``part_index`` / ``num_parts`` (one-line error
    when it is not one of ours)."""
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(marker, dict) or marker.get("version") != MARKER_VERSION:
            raise ValueError("unknown marker version")
        for new, old in (("part_index", "shard_index"), ("num_parts", "num_shards")):
            value = marker.get(new, marker.get(old))
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{new}: not an integer")
            marker[new] = value
        if not isinstance(marker.get("fingerprint_id"), str) or not isinstance(marker.get("files"), dict):
            raise ValueError("no fingerprint_id or files")
        return marker
    except (OSError, ValueError) as exc:
        raise DataprepError(f"{path}: not a part completion marker ({exc})") from None


class PartedRun:
    """Markers of a run split into ``num_parts`` parts, in ``folder`` (files of the parts in
    ``files_folder``, default the same). Constructing it checks the split (:func:`check_split`)."""

    def __init__(self, folder: str | os.PathLike[str], fingerprint: dict[str, Any], num_parts: int,
                 files_folder: str | os.PathLike[str] | None = None) -> None:
        check_split(num_parts)
        self.folder = Path(folder)
        self.files_folder = Path(files_folder) if files_folder is not None else self.folder
        self.fingerprint = fingerprint
        self.fingerprint_id = fingerprint_id(fingerprint)
        self.num_parts = num_parts

    def marker_path(self, part_index: int) -> Path:
        """Where part ``part_index``'s marker is written."""
        check_split(self.num_parts, part_index)
        return self.folder / (part_name(part_index, self.num_parts) + ".done.json")

    def _existing_marker(self, part_index: int) -> Path | None:
        for prefix in _PREFIXES:
            path = self.folder / (part_name(part_index, self.num_parts, prefix) + ".done.json")
            if path.exists():
                return path
        return None

    def markers(self) -> list[tuple[Path, dict[str, Any]]]:
        """Every marker in the folder (any run), by file name."""
        if not self.folder.is_dir():
            return []
        paths = sorted({p for prefix in _PREFIXES for p in self.folder.glob(f"{prefix}-*-of-*.done.json")})
        return [(p, read_marker(p)) for p in paths]

    def check_folder(self) -> None:
        """Refuse a folder holding a marker of another fingerprint (one line naming what changed)."""
        for path, marker in self.markers():
            if marker["fingerprint_id"] != self.fingerprint_id:
                raise DataprepError(
                    f"{path}: written by a different run ({_differs(marker.get('fingerprint', {}), self.fingerprint)} "
                    "changed); use a new output folder or delete this one")

    def marker(self, part_index: int) -> dict[str, Any] | None:
        """Part ``part_index``'s marker (old name or new), or ``None``."""
        path = self._existing_marker(part_index)
        return read_marker(path) if path is not None else None

    def is_done(self, part_index: int, files: Iterable[str | os.PathLike[str]]) -> bool:
        """Whether part ``part_index`` has a marker of this fingerprint recording each of ``files``
        with the SHA-256 it has now."""
        marker = self.marker(part_index)
        if marker is None or marker["fingerprint_id"] != self.fingerprint_id:
            return False
        recorded = marker["files"]
        return all(Path(p).exists() and file_sha256(p) == recorded.get(Path(p).name) for p in files)

    def forget(self, part_index: int) -> None:
        """Remove part ``part_index``'s marker(s) before it is redone."""
        for prefix in _PREFIXES:
            (self.folder / (part_name(part_index, self.num_parts, prefix) + ".done.json")).unlink(missing_ok=True)

    def mark_done(self, part_index: int, files: Sequence[str | os.PathLike[str]], **record: Any) -> dict[str, Any]:
        """Write part ``part_index``'s marker (atomically, last): the fingerprint, ``files`` with
        their SHA-256 and the job's ``record`` keys; returns it."""
        marker = {"version": MARKER_VERSION, "part_index": part_index, "num_parts": self.num_parts,
                  "fingerprint_id": self.fingerprint_id, "fingerprint": self.fingerprint, **record,
                  "files": {Path(p).name: file_sha256(p) for p in files}}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.marker_path(part_index)
        write_json(marker, path)
        for prefix in _PREFIXES[1:]:  # an old-named marker of the same part is superseded
            (self.folder / (part_name(part_index, self.num_parts, prefix) + ".done.json")).unlink(missing_ok=True)
        return marker

    @classmethod
    def complete(cls, folder: str | os.PathLike[str], files_folder: str | os.PathLike[str] | None = None,
                 what: str = "parts") -> list[dict[str, Any]]:
        """The markers (by part index) of a complete, consistent run in ``folder``, whatever its
        fingerprint. Refuses (one line) a folder without markers, parts not done (named), mixed
        fingerprints and a recorded file missing or changed since its part finished."""
        folder = Path(folder)
        if not folder.is_dir():
            raise DataprepError(f"{folder}: no such folder of {what}")
        found = PartedRun(folder, {}, 1).markers()
        if not found:
            raise DataprepError(f"{folder}: no completed parts (no part-*-of-*.done.json)")
        (first_path, first), rest = found[0], found[1:]
        for path, m in rest:
            if m["fingerprint_id"] != first["fingerprint_id"]:
                raise DataprepError(f"{folder}: parts from different runs ({path.name} vs {first_path.name}: "
                                    f"{_differs(m.get('fingerprint', {}), first.get('fingerprint', {}))} differ)")
        n = first["num_parts"]
        by_index = {m["part_index"]: m for _, m in found if m["num_parts"] == n}
        missing = [i for i in range(n) if i not in by_index]
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
            raise DataprepError(f"{folder}: {len(missing)} of {n} parts not done: {shown}")
        base = Path(files_folder) if files_folder is not None else folder
        markers = [by_index[i] for i in range(n)]
        for m in markers:
            for name, digest in m["files"].items():
                p = base / name
                if not p.exists() or file_sha256(p) != digest:
                    raise DataprepError(f"{p}: missing or changed since its part finished; re-run that part")
        return markers
