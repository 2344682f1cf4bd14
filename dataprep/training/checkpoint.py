"""Checkpoint files (``last.pt``): written sealed with a content hash, read back only if intact.

A checkpoint is a dict of tensors and plain values (``torch.save``; read with
``torch.load(weights_only=True)``). :func:`save_checkpoint` stores ``content_sha256``, the
SHA-256 of a canonical serialisation of every other field (:func:`content_sha256`), and
:func:`load_checkpoint` recomputes it on every load: a flipped byte is one line naming the file.

Canonical serialisation: each item a one-byte tag, then its content, lengths and counts as
8-byte little-endian unsigned integers. ``T`` tensor (dtype name, dims, each dim, byte count,
raw bytes of the contiguous CPU tensor, row-major); ``N`` None; ``B`` bool (one byte); ``I``
int (decimal text); ``F`` float (binary64, little-endian); ``S`` str (UTF-8); ``Y`` bytes;
``L`` list / ``U`` tuple (count, items); ``D`` dict (count, pairs sorted by the key's
serialisation). Any other type is refused.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import torch

from manifests.errors import DataprepError

HASH_FIELD = "content_sha256"
#: fields every checkpoint holds and their types (the loop adds ``config``, a dict of plain values)
REQUIRED = (("next_step", int), ("model", dict), ("optimizer", dict), ("plan_hash", str))


#: the largest integer a checkpoint may hold, in bits (its decimal text stays under Python's 4300 digits)
MAX_INT_BITS = 4096


class _Unhashable(TypeError):
    """A value the canonical serialisation has no tag for."""


def _n(x: int) -> bytes:
    return struct.pack("<Q", x)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return tag + _n(len(data)) + data


def _feed(h: Any, obj: Any) -> None:
    """Add ``obj``'s canonical serialisation (module docstring) to the hash ``h``."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise _Unhashable(f"a {obj.layout} tensor")
        t = obj.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy()
        h.update(_chunk(b"T", str(t.dtype).encode()) + _n(t.dim()) + b"".join(_n(d) for d in t.shape))
        h.update(_n(raw.nbytes))
        h.update(memoryview(raw))
    elif obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"B" + bytes([obj]))
    elif isinstance(obj, int):
        if obj.bit_length() > MAX_INT_BITS:  # past Python's decimal conversion limit: no checkpoint holds one
            raise _Unhashable(f"an integer of {obj.bit_length()} bits")
        h.update(_chunk(b"I", str(obj).encode()))
    elif isinstance(obj, float):
        h.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, str):
        h.update(_chunk(b"S", obj.encode("utf-8", "surrogatepass")))
    elif isinstance(obj, bytes):
        h.update(_chunk(b"Y", obj))
    elif isinstance(obj, (list, tuple)):
        h.update((b"L" if isinstance(obj, list) else b"U") + _n(len(obj)))
        for item in obj:
            _feed(h, item)
    elif isinstance(obj, dict):
        h.update(b"D" + _n(len(obj)))
        for key, value in sorted(((_key_bytes(k), v) for k, v in obj.items()), key=lambda kv: kv[0]):
            h.update(key)
            _feed(h, value)
    else:
        raise _Unhashable(f"a {type(obj).__name__}")


class _Bytes:
    """A hash-like sink that keeps the bytes (a dict key's serialisation, to sort by)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, b: bytes | memoryview) -> None:
        self.parts.append(bytes(b))


def _key_bytes(key: Any) -> bytes:
    """The serialisation of a dict key (keys are plain values: names, parameter indexes)."""
    if isinstance(key, (torch.Tensor, dict, list)):
        raise _Unhashable(f"a {type(key).__name__} as a dict key")
    out = _Bytes()
    _feed(out, key)
    return b"".join(out.parts)


def content_sha256(fields: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical serialisation of ``fields`` without ``content_sha256``."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in fields.items() if k != HASH_FIELD})
    return h.hexdigest()


def save_checkpoint(path: Path, fields: dict[str, Any]) -> None:
    """``torch.save`` ``fields`` plus their ``content_sha256`` to ``path`` (the caller makes it atomic)."""
    torch.save({**fields, HASH_FIELD: content_sha256(fields)}, path)


def _load_problem(exc: BaseException) -> str:
    """One line of why ``torch.load`` refused a file: the weights-only unpickler's own reason
    (``Unsupported global: ...``), not torch's advice to switch the safe mode off (never taken)."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    if not lines:
        return type(exc).__name__
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            reason = line.split("WeightsUnpickler error:", 1)[1].strip() or (lines[i + 1] if i + 1 < len(lines) else "")
            return f"refused by the weights-only loader: {reason[:160]}"
    return lines[0][:160]


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``: no code runs from the file), verify its
    content hash and check its fields' types; :class:`DataprepError` as ``FILE: field: problem``.
    Whether ``next_step`` and ``plan_hash`` resume a plan is :func:`manifests.plan_cursor.resume_point` 's."""
    if path.is_dir():
        raise DataprepError(f"{path}: is a directory, not a checkpoint file")
    if not path.is_file():
        raise DataprepError(f"{path}: no checkpoint to resume from")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001  (any undecodable or unsafe file is the same user error)
        raise DataprepError(f"{path}: not a readable checkpoint ({_load_problem(exc)})") from None
    if not isinstance(ckpt, dict):
        raise DataprepError(f"{path}: expected a checkpoint dict, got {type(ckpt).__name__}")
    stored = ckpt.get(HASH_FIELD)
    if not isinstance(stored, str):
        raise DataprepError(f"{path}: {HASH_FIELD}: missing (not a checkpoint this tool wrote, or damaged)")
    try:
        actual = content_sha256(ckpt)
    except _Unhashable as exc:
        raise DataprepError(f"{path}: not a checkpoint this tool wrote (holds {exc})") from None
    except RecursionError:
        raise DataprepError(f"{path}: not a checkpoint this tool wrote (values nested too deep)") from None
    if actual != stored:
        raise DataprepError(f"{path}: {HASH_FIELD}: the tensors and fields do not match the stored hash "
                            "(damaged file)")
    for key, kind in REQUIRED:
        if key not in ckpt:
            raise DataprepError(f"{path}: {key}: missing")
        if not isinstance(ckpt[key], kind) or isinstance(ckpt[key], bool):
            raise DataprepError(f"{path}: {key}: expected {kind.__name__}, got {type(ckpt[key]).__name__}")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in ckpt["model"].items()):
        raise DataprepError(f"{path}: model: expected a state dict of named tensors")
    return ckpt
