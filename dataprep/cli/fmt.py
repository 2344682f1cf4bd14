"""How the commands write figures: tables that never cut a cell, counts with the right plural,
percentages without a negative zero; and ``--help`` without a type shown for plain flags.

Every command's table is a :class:`Table` (a cell too wide for a narrow terminal wraps onto the
next line instead of ending in "…"; off a terminal the console is as wide as the table:
:mod:`dataprep.cli.app`)."""

from __future__ import annotations

from typing import Any

from rich import table as rich_table
from typer.core import TyperOption


class Table(rich_table.Table):
    """A rich table whose columns fold a cell too wide for the terminal rather than cut it."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


def plural(n: int | float, word: str, many: str | None = None) -> str:
    """``"1 batch"``, ``"2 batches"``: ``n`` (thousands separated) and ``word`` or its plural
    (``many``, else ``word + "es"`` after s, x, z, sh, tch: batches; else ``word + "s"``: epochs)."""
    if n == 1:
        return f"{n:,} {word}"
    if many is None:
        many = word + ("es" if word.endswith(("s", "x", "z", "sh", "tch")) else "s")
    return f"{n:,} {many}"


def pct(share: float, digits: int = 1) -> str:
    """``share`` (0.123) as a percentage (``"12.3%"``); a value that rounds to zero is ``0.0%``,
    never ``-0.0%``."""
    text = f"{100 * share:.{digits}f}%"
    return text[1:] if text.startswith("-") and float(text[:-1]) == 0 else text


def _flag_type(self: TyperOption, ctx: Any, _shown: Any = TyperOption.display_type_rich) -> str | None:
    """``--help``'s type column: nothing for a plain flag (``--strict``, ``--carry/--no-carry``),
    which takes no value, instead of typer's ``<bool>``."""
    return None if self.is_flag else _shown(self, ctx)


TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]
