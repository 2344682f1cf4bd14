"""A manifest's ``corpus`` column as int32 codes (read dictionary-encoded, never as strings),
whole or in blocks of N rows, and the corpora's names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow.parquet as pq

from manifests.errors import ManifestError
from manifests.manifest_read import check_manifest_file
from manifests.schema import CORPUS_COLUMN


def read_corpus_codes(path: str | os.PathLike[str], names: Sequence[str] | None = None
                      ) -> tuple[npt.NDArray[np.int32], list[str]] | None:
    """The ``corpus`` column of a manifest as codes (int32, 4 bytes a row: read dictionary-
    encoded, never as strings) and the names they index; None when the manifest has no corpus.

    ``names`` given: codes index them, -1 for a corpus not among them; else the corpora in
    order of first appearance. A row without a corpus is a one-line error.
    """
    known = list(names) if names is not None else []
    parts = _corpus_code_parts(path, known, grow=names is None)
    if parts is None:
        return None
    got = list(parts)
    codes = np.concatenate(got) if got else np.empty(0, np.int32)
    return codes, known


def corpus_names(path: str | os.PathLike[str]) -> list[str] | None:
    """The corpora of a manifest in order of first appearance (the names
    :func:`read_corpus_codes` returns), read in blocks without keeping the codes; None when
    the manifest has no corpus."""
    known: list[str] = []
    parts = _corpus_code_parts(path, known, grow=True)
    if parts is None:
        return None
    for _ in parts:
        pass
    return known


def iter_corpus_codes(path: str | os.PathLike[str], names: Sequence[str], rows: int
                      ) -> Iterator[npt.NDArray[np.int32]] | None:
    """The codes of :func:`read_corpus_codes` (indexing ``names``, -1 for another corpus) in
    consecutive blocks of ``rows`` rows (the last shorter): memory about one block, whatever the
    manifest's size. None when the manifest has no corpus."""
    parts = _corpus_code_parts(path, list(names), grow=False)
    if parts is None:
        return None

    def blocks(parts: Iterator[npt.NDArray[np.int32]]) -> Iterator[npt.NDArray[np.int32]]:
        pending: list[npt.NDArray[np.int32]] = []
        have = 0
        for part in parts:
            while part.size:
                take = min(rows - have, part.size)
                pending.append(part[:take])
                have += take
                part = part[take:]
                if have == rows:
                    yield np.concatenate(pending)
                    pending, have = [], 0
        if have:
            yield np.concatenate(pending)

    return blocks(parts)


def _corpus_code_parts(path: str | os.PathLike[str], known: list[str], *, grow: bool
                       ) -> Iterator[npt.NDArray[np.int32]] | None:
    """Corpus codes of consecutive Parquet batches (indexing ``known``, -1 for another corpus;
    ``grow``: a new corpus is appended to ``known`` instead); None without a corpus column."""
    check_manifest_file(path)
    if CORPUS_COLUMN not in pq.read_schema(path).names:
        return None
    index = {n: i for i, n in enumerate(known)}

    def parts() -> Iterator[npt.NDArray[np.int32]]:
        file = pq.ParquetFile(path, read_dictionary=[CORPUS_COLUMN], pre_buffer=False, buffer_size=1 << 20)
        for batch in file.iter_batches(batch_size=1 << 20, columns=[CORPUS_COLUMN], use_threads=False):
            chunk = batch.column(0)
            if chunk.null_count:
                raise ManifestError(f"{path}: corpus: a row has no corpus")
            values = chunk.dictionary.to_pylist()
            if grow:
                for v in values:
                    if v not in index:
                        index[v] = len(known)
                        known.append(v)
            lut = np.asarray([index.get(v, -1) for v in values] or [-1], dtype=np.int32)
            yield lut[chunk.indices.to_numpy(zero_copy_only=False)]

    return parts()
