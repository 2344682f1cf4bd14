"""Sizes as users write them: ``"80GiB"``, ``"40GB"``, ``"512MiB"``, ``"1048576"``, ``"5%"``."""

from __future__ import annotations

import re

from manifests.errors import DataprepError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, total: int | None = None) -> int:
    """``"80GiB"``, ``"40GB"``, ``"1048576"``; with ``total``, also ``"5%"`` of it."""
    s = text.strip().lower().replace(" ", "")
    if s.endswith("%"):
        if total is None:
            raise DataprepError(f"{text!r}: a percentage needs the device memory")
        try:
            return int(float(s[:-1]) / 100.0 * total)
        except ValueError:
            raise DataprepError(f"{text!r}: not a percentage") from None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise DataprepError(f"{text!r}: not a memory size (e.g. 80GiB, 40GB, 5%)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])
