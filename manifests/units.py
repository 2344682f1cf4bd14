"""Sizes as users write them: ``"80GiB"``, ``"40GB"``, ``"512MiB"``, ``"1048576"`` (bytes), and
``"5%"`` of a total where the option has one (device memory, the machine's memory). The hint
of an error shows a percentage only where one is accepted."""

from __future__ import annotations

import math
import os
import re

from manifests.errors import DataprepError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, total: int | None = None, *, flag: str | None = None, of: str = "the device memory") -> int:
    """``"80GiB"``, ``"40GB"``, ``"1048576"``; with ``total``, also ``"5%"`` of it (a finite
    percentage in (0, 100]). ``flag`` opens the one-line error; ``of`` names what ``total`` is."""
    where = f"{flag}: " if flag else ""
    s = text.strip().lower().replace(" ", "")
    if s.endswith("%"):
        if total is None:
            raise DataprepError(f"{where}{text!r}: a percentage is not accepted here; give a size (e.g. 80GiB, 40GB)")
        try:
            pct = float(s[:-1])
        except ValueError:
            pct = math.nan
        if not (0 < pct <= 100):
            raise DataprepError(f"{where}{text!r}: not a percentage in (0, 100] of {of}")
        return int(pct / 100.0 * total)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        eg = "80GiB, 40GB, 5%" if total is not None else "80GiB, 40GB, 512MiB"
        raise DataprepError(f"{where}{text!r}: not a memory size (e.g. {eg})")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(value):
        raise DataprepError(f"{where}{text[:40]!r}...: too large a memory size")
    return int(value)


def machine_memory() -> int:
    """The machine's physical memory in bytes (8 GiB where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30
