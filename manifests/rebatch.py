"""Arrow tables pushed in any split, regrouped into consecutive tables of exactly N rows.

Hashing, row-group writing and block-wise reading all need fixed-size blocks whatever the
chunking of their input; memory is at most N rows plus the table being pushed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa


class Rebatcher:
    """Tables pushed in any split, regrouped into consecutive tables of exactly ``rows`` rows:
    :meth:`push` yields each block as it fills, :meth:`rest` returns the short last one (None
    when nothing is pending). Holds at most ``rows`` rows + the table being pushed."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._pending: list[pa.Table] = []
        self._have = 0

    def push(self, table: pa.Table | pa.RecordBatch) -> Iterator[pa.Table]:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        while table.num_rows:
            take = min(self.rows - self._have, table.num_rows)
            self._pending.append(table.slice(0, take))
            self._have += take
            table = table.slice(take)
            if self._have == self.rows:
                yield self._take()

    def rest(self) -> pa.Table | None:
        return self._take() if self._have else None

    def _take(self) -> pa.Table:
        block = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._have = [], 0
        return block


def rebatch(tables: Iterable[pa.Table | pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Regroup a stream of tables into consecutive tables of exactly ``rows`` rows (the last
    one shorter; none for an empty stream). Holds at most ``rows`` + one input table."""
    blocks = Rebatcher(rows)
    for t in tables:
        yield from blocks.push(t)
    last = blocks.rest()
    if last is not None:
        yield last
