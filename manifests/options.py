"""The one set of range checks for options, used by every options object's ``__post_init__``
(``PlanOptions``, ``TrainConfig``, ``OomOptions``, ...) and by the CLI for the few flags that
no options object holds. Each raises :class:`~manifests.errors.OptionError` naming the field.

Integers are ``int`` only (``True``, ``3.0`` and ``'3'`` are refused, never coerced); numbers
are ``int`` or ``float`` (not ``bool``) and finite. ``None`` passes where ``optional``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from manifests.errors import OptionError

#: Upper bound on counts such as world sizes, epochs and batch sizes (a typo, not a cluster).
MAX_COUNT = 2**20
#: Highest audio sample rate accepted anywhere (Hz): DXD studio audio; above is a typo.
MAX_SAMPLE_RATE = 384_000


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"  # 1048576, not 1.04858e+06


def _range(field: str, value: float, ge: float | None, gt: float | None, le: float | None) -> None:
    if ge is not None and value < ge:
        raise OptionError(field, f"must be >= {_num(ge)}, got {_num(value)}")
    if gt is not None and value <= gt:
        raise OptionError(field, f"must be > {_num(gt)}, got {_num(value)}")
    if le is not None and value > le:
        raise OptionError(field, f"must be <= {_num(le)}, got {_num(value)}")


def check_int(field: str, value: Any, *, ge: int | None = None, le: int | None = MAX_COUNT,
              optional: bool = False) -> None:
    """``value`` is an ``int`` (not a bool, float or str) within ``[ge, le]``."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(field, f"must be an integer, got {value!r}")
    _range(field, value, ge, None, le)


def check_number(field: str, value: Any, *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, optional: bool = False) -> None:
    """``value`` is a finite ``int`` or ``float`` (not a bool or str) within the bounds."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise OptionError(field, f"must be a finite number, got {value}")
    _range(field, value, ge, gt, le)


def check_bool(field: str, value: Any) -> None:
    """``value`` is ``True`` or ``False`` (not 0 / 1 or a string)."""
    if not isinstance(value, bool):
        raise OptionError(field, f"must be true or false, got {value!r}")


def check_choice(field: str, value: Any, choices: Collection[str]) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        names = list(choices)
        alts = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise OptionError(field, f"must be {alts}, got {value!r}")


def check_sample_rate(field: str, value: Any) -> None:
    """``value`` is an ``int`` sample rate in ``[1, MAX_SAMPLE_RATE]`` Hz."""
    check_int(field, value, ge=1, le=MAX_SAMPLE_RATE)


def check_str(field: str, value: Any, *, optional: bool = False) -> None:
    """``value`` is a non-empty ``str`` (or None where ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise OptionError(field, f"must be a non-empty string, got {value!r}")


def check_needs(flag: str, given: bool, needs: str, enabled: bool) -> None:
    """A flag that only matters with another (``needs``, e.g. ``--dynamic-resolution``) refused
    when given without it: it would be ignored without a word."""
    if given and not enabled:
        raise OptionError(flag, f"only matters with {needs}; add {needs} or drop {flag}")
