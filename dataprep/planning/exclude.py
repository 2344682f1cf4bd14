"""Rows a re-plan drops from its first step on (``dataprep replan --at-step K --exclude FILE``).

The file names utterances by id: a text file of one id per line (blank lines skipped), or a
Parquet file with an ``id`` column (a rejects file, a manifest). Ids become manifest row numbers
by streaming the manifest's ``id`` column block by block (memory: the ids asked and one block).
The re-plan records the excluded rows (sorted, unique) in ``plan.json`` under ``excluded``, so a
later re-plan keeps them out too and ``dataprep verify`` checks that no batch at or after the
step they were excluded from holds one. A weighted plan's later epochs draw each corpus's quota
again from its remaining rows (:class:`ExcludedDraw`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bucketing.quota import QuotaSampler
from manifests.arrow_views import numeric_values
from manifests.errors import DataprepError
from manifests.manifest_read import iter_manifest
from manifests.plan_files import PlanShard
from manifests.plan_meta import PlanMeta

if TYPE_CHECKING:
    from dataprep.planning.spill import SpilledCorpus

#: manifest rows per block while ids are matched to row numbers
ID_BLOCK_ROWS = 1 << 20
#: the ``plan.json`` key (under the writer's extra keys) of a re-plan's exclusions
EXCLUDED_KEY = "excluded"


def read_excluded_ids(path: str | os.PathLike[str]) -> pl.Series:
    """The ids ``path`` lists (unique): a Parquet file's ``id`` column, else one id per line of a
    UTF-8 text file (surrounding whitespace stripped, blank lines skipped)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise DataprepError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataprepError(f"{path}: cannot read ({exc.strerror})") from None
    if head == b"PAR1":
        try:
            names = pq.read_schema(path).names
            if "id" not in names:
                raise DataprepError(f"{path}: a Parquet file without an `id` column (columns: {', '.join(names)})")
            ids = pq.read_table(path, columns=["id"]).column("id")
        except (OSError, pa.ArrowException) as exc:
            raise DataprepError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0][:160]})") from None
        if not pa.types.is_string(ids.type) and not pa.types.is_large_string(ids.type):
            raise DataprepError(f"{path}: column `id` is {ids.type}, not strings")
        if ids.null_count:
            raise DataprepError(f"{path}: column `id` has {ids.null_count} null(s)")
        return pl.Series("id", ids.cast(pa.large_string()).to_pylist(), dtype=pl.String).unique()
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataprepError(f"{path}:{line}: not UTF-8 text (one id per line, or a Parquet file with an `id` "
                            "column)") from None
    ids = pl.Series("id", text.splitlines(), dtype=pl.String).str.strip_chars()
    return ids.filter(ids != "").unique()


def excluded_rows(manifest: str | os.PathLike[str], ids: pl.Series) -> tuple[npt.NDArray[np.int64], int]:
    """Manifest row numbers (sorted, unique) of ``ids``, and how many of ``ids`` the manifest
    does not hold. Streams the manifest's ids (:data:`ID_BLOCK_ROWS` rows a block)."""
    found: list[npt.NDArray[np.int64]] = []
    matched = 0
    start = 0
    for block in iter_manifest(manifest, ["id"], ID_BLOCK_ROWS):
        col = pl.from_arrow(block.column("id"))
        hit = col.is_in(ids.implode()).to_numpy()
        rows = np.flatnonzero(hit).astype(np.int64) + start
        found.append(rows)
        matched += int(col.filter(pl.Series(hit)).n_unique())
        start += block.num_rows
    rows = np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)
    return rows, int(ids.len()) - matched


def is_excluded(rows: npt.NDArray[np.int64], excluded: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Whether each of ``rows`` is among ``excluded`` (sorted, unique manifest row numbers)."""
    if excluded.shape[0] == 0:
        return np.zeros(rows.shape[0], dtype=bool)
    at = np.minimum(np.searchsorted(excluded, rows), excluded.shape[0] - 1)
    return excluded[at] == rows


def recorded_exclusions(meta: PlanMeta, where: str) -> tuple[npt.NDArray[np.int64], int | None]:
    """The rows a plan's ``plan.json`` records as excluded and the step they are excluded from
    (empty and None when the plan excludes none); each field checked."""
    entry = meta.extra.get(EXCLUDED_KEY)
    if entry is None:
        return np.zeros(0, np.int64), None
    if not isinstance(entry, dict) or not isinstance(entry.get("rows"), list) \
            or type(entry.get("from_step")) is not int:
        raise DataprepError(f"{where}: {EXCLUDED_KEY}: expected {{'rows': [...], 'from_step': int, ...}}")
    rows = entry["rows"]
    if not all(type(r) is int for r in rows):
        raise DataprepError(f"{where}: {EXCLUDED_KEY}.rows: expected integers")
    arr = np.asarray(rows, dtype=np.int64)
    if arr.shape[0] and (arr[0] < 0 or arr[-1] >= meta.manifest.rows or np.any(np.diff(arr) <= 0)):
        raise DataprepError(f"{where}: {EXCLUDED_KEY}.rows: expected ascending row numbers below "
                            f"{meta.manifest.rows}")
    return arr, int(entry["from_step"])


def exclusion_entry(rows: npt.NDArray[np.int64], from_step: int, sources: list[str], unknown: int) -> dict[str, Any]:
    """The ``plan.json`` entry of a re-plan's exclusions."""
    return {"rows": rows.tolist(), "from_step": from_step, "files": sources, "unknown_ids": unknown}


def check_exclusions(plan_dir: str | os.PathLike[str], meta: PlanMeta) -> tuple[int, int | None]:
    """Refuse a plan a batch of which, at or after the step its exclusions start, holds an
    excluded row; returns the number of excluded rows and that step (0 and None for a plan
    that excludes none). Reads the shards' ``rows`` one row group at a time."""
    excluded, from_step = recorded_exclusions(meta, f"{plan_dir}/plan.json")
    if from_step is None or excluded.shape[0] == 0:
        return 0, None
    for rank in range(meta.world_size):
        shard = PlanShard(plan_dir, rank, meta)
        for t in shard.iter_tables(max(from_step, meta.first_step), columns=["rows"]):
            rows = numeric_values(pc.list_flatten(t.column("rows")), np.int64)
            bad = is_excluded(rows, excluded)
            if bad.any():
                raise DataprepError(f"{shard.path}: holds excluded manifest row {int(rows[bad][0])} at or after "
                                    f"step {from_step}")
    return int(excluded.shape[0]), from_step


class ExcludedDraw:
    """A weighted re-plan's epochs without ``excluded`` rows: each corpus's quota drawn again
    from its remaining rows (:class:`bucketing.quota.QuotaSampler` of the remaining sizes; a
    remaining row's index is its index among them), so every corpus still gives exactly its
    quota per epoch and an under-sampled one covers all its remaining rows before any repeats.
    The excluded rows of each corpus are found once, one bucket of the spill at a time."""

    def __init__(self, corpus: SpilledCorpus, excluded: npt.NDArray[np.int64], num_corpora: int) -> None:
        self.corpus, self.excluded = corpus, excluded
        found: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(num_corpora)]
        for k in np.flatnonzero(corpus.counts).tolist():
            own = corpus.column(k, "rows", corpus.row_dtype).astype(np.int64, copy=False)
            hit = is_excluded(own, excluded)
            if hit.any():
                codes = corpus.column(k, "c", np.int32)[hit]
                for c in np.unique(codes).tolist():
                    found[c].append(own[hit][codes == c])
        #: per corpus, its excluded manifest rows that lie in a bucket (ascending)
        self.by_corpus = [np.sort(np.concatenate(f)) if f else np.zeros(0, np.int64) for f in found]
        self._samplers: dict[int, QuotaSampler] = {}

    def sampler(self, parent: QuotaSampler, names: list[str]) -> QuotaSampler:
        """``parent``'s quotas and seed over the remaining rows of each corpus."""
        got = self._samplers.get(id(parent))
        if got is None:
            left = parent.sizes - np.asarray([b.shape[0] for b in self.by_corpus], dtype=np.int64)
            gone = np.flatnonzero((left == 0) & (parent.quota > 0))
            if gone.shape[0]:
                c = int(gone[0])
                raise DataprepError(f"every row of corpus {names[c]!r} is excluded; its quota of "
                                    f"{int(parent.quota[c]):,} utterances an epoch cannot be drawn")
            got = self._samplers[id(parent)] = QuotaSampler(left, parent.quota, parent.seed)
        return got

    def times(self, k: int, sampler: QuotaSampler, epoch: int) -> npt.NDArray[np.int64]:
        """Times each row of bucket ``k`` (its column order) is taken in ``epoch`` by ``sampler``
        (of :meth:`sampler`): 0 for an excluded row."""
        own = self.corpus.column(k, "rows", self.corpus.row_dtype).astype(np.int64, copy=False)
        codes = self.corpus.column(k, "c", np.int32).copy()
        index = self.corpus.column(k, "i", self.corpus.row_dtype).astype(np.int64)
        for c in np.unique(codes[codes >= 0]).tolist():
            if self.by_corpus[c].shape[0]:
                at = codes == c
                index[at] -= np.searchsorted(self.by_corpus[c], own[at])
        codes[is_excluded(own, self.excluded)] = -1
        return sampler.times(codes, index, epoch)
