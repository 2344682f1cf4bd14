"""Plans that know the store: a bucket's rows ordered in shuffled blocks of containers.

With ``PlanOptions.container_block = K``, each epoch shuffles the containers of a bucket (tar
shards, or a loose file each) and groups them K at a time into blocks; a block's rows are
in manifest order (a container's members in the order they are stored: neighbouring
members are one read), blocks follow one another, and batches are cut from
that order as usual. A batch then draws from at most two neighbouring blocks (one where a
block holds at least a batch), so a rank-step touches at most 2K containers; every row is
still planned once per epoch (the order is a permutation). The price in randomness: a row's
batch mates come from its block (about K containers' rows of the bucket) instead of the
whole bucket; :meth:`ContainerBlocks.entry` records both sizes in ``plan.json``.
Units: rows; codes are dense int32 per manifest row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from manifests.manifest_read import read_manifest


def container_codes(manifest: str) -> npt.NDArray[np.int32]:
    """Per manifest row, a dense code of the object its audio lives in: its container, or its
    audio file where it has none (4 bytes a row)."""
    df = read_manifest(manifest, columns=["audio_path"], optional=["container"])
    name = pl.coalesce("container", "audio_path") if "container" in df.columns else pl.col("audio_path")
    codes = df.select(name.fill_null("").rank("dense").cast(pl.Int64) - 1).to_series()
    return codes.to_numpy().astype(np.int32)


class ContainerBlocks:
    """The block order of each bucket (module docstring): ``codes`` per manifest row, ``K``
    containers a block. Keeps the sums :meth:`entry` reports (rows weighted by their block's
    and their bucket's row counts)."""

    def __init__(self, codes: npt.NDArray[np.int32], containers: int) -> None:
        self.codes = codes
        self.containers = containers
        self.rows = 0
        self.mates = 0.0  # sum over rows of their block's rows
        self.bucket = 0.0  # sum over rows of their bucket's rows

    def order(self, rows: npt.NDArray[Any], d: npt.NDArray[np.float64], rng: np.random.Generator
              ) -> npt.NDArray[np.int64]:
        """Positions of one bucket's rows (manifest row numbers ``rows``, durations ``d``) in
        batch order: blocks of ``K`` shuffled containers, in manifest order inside a block
        (``d`` is not used: the bucket bounds the padding)."""
        n = int(rows.shape[0])
        if n == 0:
            return np.zeros(0, np.int64)
        uniq, inv = np.unique(self.codes[rows], return_inverse=True)
        inv = inv.reshape(-1)
        place = np.empty(uniq.shape[0], np.int64)
        place[rng.permutation(uniq.shape[0])] = np.arange(uniq.shape[0])
        block = place[inv] // self.containers
        order = np.lexsort((rows, block))
        sizes = np.bincount(block)
        self.rows += n
        self.mates += float((sizes.astype(np.float64) ** 2).sum())
        self.bucket += float(n) * n
        return order.astype(np.int64)

    def entry(self) -> dict[str, Any]:
        """``plan.json``'s ``container_blocks``: K, and the mean rows a row's batch mates are
        drawn from with blocks (its block) and without (its bucket)."""
        rows = max(self.rows, 1)
        return {"containers": self.containers, "mates_rows": round(self.mates / rows, 1),
                "bucket_rows": round(self.bucket / rows, 1)}
