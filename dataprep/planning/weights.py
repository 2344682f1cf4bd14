"""Weighted plans over many corpora: the planner's hook.

A manifest compiled from an ``input_cfg`` blend has a ``corpus`` column and records the blend
tree (weights, temperatures) in its metadata; ``--weights CORPUS=W ... --temperature T``
override it. :func:`weighted_epochs` turns them into a :class:`WeightedEpochs`: NeMo's
probabilities, each corpus's exact quota per epoch and the sampler that picks its rows
(:mod:`bucketing.quota`). The planner then plans each epoch over that epoch's multiset of rows
instead of every row once (:func:`dataprep.planning.draw.draw_epoch`; a row taken
twice is batched twice). Without weights nothing here runs and plans stay byte for byte
the unweighted ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.padding import GROUP_TICKS_PER_SECOND, group_json
from bucketing.quota import (
    QuotaError,
    QuotaSampler,
    blend_probabilities,
    epoch_size_for_hours,
    flat_tree,
    is_weighted,
    quotas,
)
from dataprep.planning.options import PlanOptions
from manifests.errors import DataprepError, OptionError
from manifests.arrow_views import numpy_view, single_chunk
from manifests.corpus_codes import corpus_names, iter_corpus_codes
from manifests.manifest_read import read_metadata


def parse_weights(pairs: list[str] | None) -> dict[str, float] | None:
    """``CORPUS=W`` strings (the CLI's ``--weights``) as a mapping; one-line errors."""
    if not pairs:
        return None
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.rpartition("=")
        try:
            w = float(value)
        except ValueError:
            w = math.nan
        if not sep or not name or not math.isfinite(w) or w <= 0:
            raise OptionError("weights", f"{pair!r}: expected CORPUS=WEIGHT with a weight > 0, e.g. librispeech=960")
        if name in out:
            raise OptionError("weights", f"corpus {name!r} given twice")
        out[name] = w
    return out


def _weights_given(options: PlanOptions) -> bool:
    return any(x is not None for x in (options.weights, options.temperature, options.epoch_utterances,
                                       options.epoch_hours))


def wants_weights(manifest: str | os.PathLike[str], opts: PlanOptions) -> bool:
    """Whether a plan of ``manifest`` with ``opts`` is weighted (weight options given, or a
    weighted blend recorded); reads only the manifest's metadata."""
    if _weights_given(opts):
        return True
    tree = _blend_tree(manifest)
    return tree is not None and is_weighted(tree)


@dataclass
class WeightedEpochs:
    """A weighted plan's corpora, quotas and row sampler (module docstring)."""

    names: list[str]
    probabilities: npt.NDArray[np.float64]
    quota: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]  # plannable rows per corpus
    sampler: QuotaSampler
    source: str
    tree: dict[str, Any]
    temperature: float | None
    epoch_size: int
    _totals: npt.NDArray[np.int64] = field(init=False)  # bucketing.padding.group_padding, summed
    _epochs: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._totals = np.zeros((5, len(self.names)), dtype=np.int64)

    def add_totals(self, totals: npt.NDArray[np.int64]) -> None:
        """Count a planned epoch by its :func:`bucketing.padding.group_padding` totals."""
        self._totals += totals
        self._epochs += 1

    def to_json(self) -> dict[str, Any]:
        """What ``plan.json`` records under ``weights``: the blend, temperature, epoch size and
        per corpus its rows, probability, quota, repeats and (per epoch) hours and padding."""
        per = group_json(self.names, self._totals, max(self._epochs, 1))
        corpora = []
        for c, name in enumerate(self.names):
            fewest, most = self.sampler.repeats[c]
            corpora.append({"corpus": name, "rows": int(self.rows[c]),
                            "probability": round(float(self.probabilities[c]), 9), "quota": int(self.quota[c]),
                            "repeats": [fewest, most], "hours_per_epoch": per[c]["hours"],
                            "padding_audio": per[c]["padding_audio"], "padding_tokens": per[c]["padding_tokens"]})
        return {"source": self.source, "tree": self.tree, "temperature": self.temperature,
                "epoch_size": self.epoch_size, "epoch_quota": int(self.quota.sum()), "corpora": corpora}


def _blend_tree(manifest: str | os.PathLike[str]) -> dict[str, Any] | None:
    blend = read_metadata(manifest)["provenance"].get("blend")
    return blend.get("tree") if isinstance(blend, dict) else None


@dataclass(frozen=True)
class Blend:
    """A weighted plan's blend: where it comes from (``options``, ``plan`` or ``manifest``), its
    tree and NeMo's probability per corpus (tree order)."""

    source: str
    tree: dict[str, Any]
    probabilities: dict[str, float]


def blend_of(manifest: str | os.PathLike[str], opts: PlanOptions,
             tree: Mapping[str, Any] | None = None) -> Blend | None:
    """The blend of a plan of ``manifest`` (None: unweighted, every row once per epoch).

    Weights come from ``opts.weights``, else ``tree`` (a re-plan passes its parent's), else the
    blend the manifest records (its metadata only is read)."""
    if opts.weights is not None:
        source, tree = "options", flat_tree(opts.weights, opts.temperature)
    elif tree is not None:
        source = "plan"
    else:
        source, tree = "manifest", _blend_tree(manifest)
        if tree is None or not is_weighted(tree):
            if _weights_given(opts):
                raise DataprepError(f"{manifest}: records no weighted blend; give --weights CORPUS=W ... "
                                    "(the corpora of its corpus column)")
            return None
    try:
        probs = blend_probabilities(tree, opts.temperature if source != "options" else None)
    except QuotaError as exc:
        raise DataprepError(f"{manifest}: weights: {exc}") from None
    return Blend(source, dict(tree), probs)


def unknown_corpus_error(manifest: str | os.PathLike[str], names: list[str]) -> DataprepError:
    """The one-line error for a manifest row whose corpus the blend does not weigh."""
    missing = [n for n in (corpus_names(manifest) or []) if n not in names]
    return DataprepError(f"{manifest}: corpus {(missing or ['?'])[0]!r} has no weight ({', '.join(names)} have)")


def weighting(manifest: str | os.PathLike[str], blend: Blend, rows: npt.NDArray[np.int64],
              micros: npt.NDArray[np.int64], opts: PlanOptions) -> WeightedEpochs:
    """The quotas and sampler of ``blend`` over corpora of ``rows`` plannable rows holding
    ``micros`` microseconds each (:data:`bucketing.padding.GROUP_TICKS_PER_SECOND`, exact
    sums: the epoch size for ``--epoch-hours`` does not depend on how they were summed)."""
    names = list(blend.probabilities)
    p = np.asarray([blend.probabilities[n] for n in names], dtype=np.float64)
    flag = "--epoch-utterances"
    try:
        if opts.epoch_utterances is not None:
            n = opts.epoch_utterances
        elif opts.epoch_hours is not None:
            flag = "--epoch-hours"
            mean = micros / GROUP_TICKS_PER_SECOND / np.maximum(rows, 1)
            n = epoch_size_for_hours(p, mean, opts.epoch_hours)
        else:
            n = int(rows.sum())
        most = MAX_EPOCH_FACTOR * max(int(rows.sum()), 1)
        if n > most:
            raise QuotaError(f"an epoch of {n} utterances is more than {MAX_EPOCH_FACTOR} times the "
                             f"{int(rows.sum())} rows in a bucket")
        q = quotas(p, n)
    except QuotaError as exc:
        raise DataprepError(f"{manifest}: {flag}: {exc}") from None
    repeats = q // np.maximum(rows, 1)
    if (repeats > MAX_REPEATS).any():
        c = int(np.argmax(repeats))
        raise DataprepError(f"{manifest}: corpus {names[c]!r} would take each of its {int(rows[c])} rows "
                            f"{int(repeats[c])} times an epoch (its quota {int(q[c])}), more than {MAX_REPEATS}; "
                            "lower its weight or the epoch size")
    empty = [names[c] for c in np.flatnonzero((rows == 0) & (q > 0))]
    if empty:
        raise DataprepError(f"{manifest}: corpus {empty[0]!r} has a quota but no row in a bucket")
    sampler = QuotaSampler(rows, q, opts.seed)
    return WeightedEpochs(names, p, q, rows, sampler, blend.source, blend.tree, opts.temperature, n)


#: Most utterances a weighted epoch may hold, as a multiple of the rows it draws from
MAX_EPOCH_FACTOR = 1024
#: Most times one row may be taken in one epoch (times are counted in int32 per row)
MAX_REPEATS = 2**20


#: manifest rows whose corpus codes ``check_quotas`` holds at once (int32: 256 MiB); a bigger
#: manifest costs one more pass over the plan's ``epoch`` / ``rows`` columns per block
QUOTA_BLOCK_ROWS = 1 << 26


def check_quotas(plan_dir: str | os.PathLike[str], manifest: str | os.PathLike[str],
                 block_rows: int = QUOTA_BLOCK_ROWS) -> int:
    """Check that every whole epoch of a weighted plan holds exactly each corpus's recorded
    quota (by the manifest's ``corpus`` column); returns the epochs checked (a re-plan's first,
    partial epoch is not). Memory bounded whatever the corpus: the corpus codes of
    ``block_rows`` manifest rows at a time, and one row group of one shard (each block reads
    the shards' ``epoch`` and ``rows`` once more)."""
    from manifests.plan_files import PlanShard
    from manifests.plan_meta import read_plan_meta

    meta = read_plan_meta(plan_dir)
    recorded = meta.extra.get("weights")
    if not isinstance(recorded, dict):
        raise DataprepError(f"{plan_dir}: not a weighted plan")
    names = [c["corpus"] for c in recorded["corpora"]]
    want = np.tile(np.asarray([c["quota"] for c in recorded["corpora"]], dtype=np.int64), (meta.epochs, 1))
    for st in meta.extra.get("stages") or []:  # a staged plan: each stage's epochs, its quotas
        quota = {c["corpus"]: int(c["quota"]) for c in st["weights"]["corpora"]}
        want[st["epochs"][0]:st["epochs"][1] + 1] = [quota[n] for n in names]
    blocks = iter_corpus_codes(manifest, names, block_rows)
    if blocks is None:
        raise DataprepError(f"{manifest}: has no corpus column, the plan's manifest has")
    whole = np.asarray([start >= meta.first_step for start in meta.first_step_of_epoch], dtype=bool)
    c = len(names)
    got = np.zeros(meta.epochs * (c + 1), dtype=np.int64)  # per epoch: each corpus, then "another"
    start = 0
    for codes in blocks:
        stop = start + codes.shape[0]
        for r in range(meta.world_size):
            for t in PlanShard(plan_dir, r, meta).iter_tables(meta.first_step, columns=["epoch", "rows"]):
                rows_col = single_chunk(t.column("rows"))
                offs = numpy_view(rows_col.offsets, np.int32)
                rows = numpy_view(rows_col.values, np.int64)[offs[0]:offs[-1]]
                epoch = np.repeat(numpy_view(t.column("epoch"), np.int32), np.diff(offs))
                sel = (rows >= start) & (rows < stop) & whole[epoch]
                code = codes[rows[sel] - start]
                got += np.bincount(epoch[sel].astype(np.int64) * (c + 1) + np.where(code < 0, c, code),
                                   minlength=got.size)
        start = stop
    got = got.reshape(meta.epochs, c + 1)
    for e in np.flatnonzero(whole).tolist():
        if got[e, c]:
            raise DataprepError(f"{plan_dir}: epoch {e}: {int(got[e, c])} utterances of a corpus the plan's "
                                f"weights do not list (plan made from another manifest?)")
        if not np.array_equal(got[e, :c], want[e]):
            k = int(np.flatnonzero(got[e, :c] != want[e])[0])
            raise DataprepError(f"{plan_dir}: epoch {e}: corpus {names[k]!r} has {int(got[e, k])} utterances, "
                                f"its quota is {int(want[e, k])}")
    return int(whole.sum())
