"""Section 3 of ``dataprep report``, the plan: summary figures, one epoch's steps (windows
of steps past :data:`MAX_STEP_POINTS`) and ranks, per-epoch corpus shares and simulated world
sizes. Bounded by steps, ranks, corpora and epochs, never by rows: the shares join each range
of rows (held in memory when they fit, else spilled) to the epoch's planned rows of it.
Units: hours, seconds, shares in 0..1."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from bucketing.costmodel import CostModel
from bucketing.held_columns import HeldColumns
from dataprep.planning.simulate import DEFAULT_WORLD_SIZES, plan_steps_report, read_epoch_batches, simulate_plan
from dataprep.report.stream_sections import CorpusShares, planned_times, share_range_rows, spill_planned_rows
from manifests.plan_meta import PlanMeta
from manifests.spill import SpillFiles, remove_spill

#: steps drawn in the steps chart (about one per pixel); longer epochs are shown as windows of
#: consecutive steps
MAX_STEP_POINTS = 600
#: epochs whose per-corpus shares are computed
MAX_SHARE_EPOCHS = 20
#: rows of a group table shown (the rest summed in one "other" row)
MAX_GROUPS = 60


def _r(x: float, digits: int = 6) -> float:
    """A float rounded for the page (no NaN / inf: those become 0)."""
    return round(float(x), digits) if math.isfinite(x) else 0.0


class CorpusCodes(Protocol):
    """The manifest's corpora: their sorted ``names`` and, per code of the rows' blocks, its
    place among them (``order``)."""

    @property
    def names(self) -> list[str]: ...

    @property
    def order(self) -> npt.NDArray[np.int32]: ...


@dataclass(frozen=True)
class PlanAggregates:
    """Section 3: summary figures, one epoch's steps and ranks, corpus shares, simulations."""

    summary: dict[str, Any]
    steps: list[dict[str, Any]]
    step_window: int
    ranks: list[dict[str, Any]]
    shares: list[dict[str, Any]]
    simulate: list[dict[str, Any]]
    #: per corpus of a weighted blend: its weight, target probability and the shares achieved
    targets: list[dict[str, Any]] = field(default_factory=list)
    #: per rank, epoch 0: requests and bytes a step reads from its store (:func:`store_rows`)
    store: list[dict[str, Any]] = field(default_factory=list)


def store_rows(plan_dir: str | os.PathLike[str], manifest: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Per rank of epoch 0, for a manifest whose audio is in a store (else none): requests, MB
    and objects a step reads (mean and max over steps), bytes fetched / used, and the default
    store model's time to first batch and utterances/s (:func:`~dataprep.planning.simulate.store_reads`)."""
    import polars as pl

    from dataprep.planning.simulate import store_reads
    from manifests.manifest_read import read_manifest
    df = read_manifest(manifest, columns=["audio_path"], optional=["container"])
    where = pl.coalesce(df["container"], df["audio_path"]) if "container" in df.columns else df["audio_path"]
    if not where.str.contains(r"^(s3a?|gs|gcs|az|azure|abfss?)://").any():
        return []  # audio on local disk: no store to read from
    r = store_reads(plan_dir, manifest)
    first = r.store.step_seconds(r.requests[0], r.nbytes[0]) if r.requests.shape[0] else np.zeros(r.requests.shape[1])
    out = []
    for k in range(r.requests.shape[1]):
        rate = r.store.steps_per_second(r.requests[:, k], r.nbytes[:, k])
        out.append({"rank": k, "requests_mean": _r(float(r.requests[:, k].mean()), 2), "requests_max": int(r.requests[:, k].max()),
                    "mb_mean": _r(float(r.nbytes[:, k].mean()) / 1e6, 3), "mb_max": _r(float(r.nbytes[:, k].max()) / 1e6, 3),
                    "objects_mean": _r(float(r.objects[:, k].mean()), 2),
                    "fetched_per_used": _r(float(r.nbytes[:, k].sum() / max(1, r.used[:, k].sum())), 4),
                    "first_batch_s": _r(float(first[k]), 3), "utt_per_s": _r(float(rate * r.rows[:, k].mean()), 1)})
    return out


def _step_rows(bucket: npt.NDArray[Any], size: npt.NDArray[Any], max_d: npt.NDArray[Any],
               times: npt.NDArray[np.float64]) -> tuple[list[dict[str, Any]], int]:
    """Per step (or window of steps when the epoch has more than :data:`MAX_STEP_POINTS`):
    its first step and the next one's (``end``: the epoch's steps for the last), rank 0's bucket, buckets at the step, mean batch size, predicted step time (max over
    ranks) and mean rank time, and balance (max / mean padded audio seconds)."""
    S = bucket.shape[0]
    padded = size * max_d
    with np.errstate(invalid="ignore", divide="ignore"):
        balance = np.where(padded.mean(axis=1) > 0, padded.max(axis=1) / padded.mean(axis=1), 1.0)
    distinct = (np.diff(np.sort(bucket, axis=1), axis=1) != 0).sum(axis=1) + 1
    per = {"bucket": bucket[:, 0].astype(np.float64), "buckets": distinct.astype(np.float64),
           "batch": size.mean(axis=1), "time_max": times.max(axis=1), "time_mean": times.mean(axis=1),
           "balance": balance}
    w = max(1, math.ceil(S / MAX_STEP_POINTS))
    if w > 1:  # windows: the mean of each figure, the max of the step time
        n = math.ceil(S / w)
        starts = np.arange(n) * w
        per = {k: (np.maximum.reduceat(v, starts) if k in ("time_max", "buckets", "balance")
                   else np.add.reduceat(v, starts) / np.diff(np.append(starts, S))) for k, v in per.items()}
    else:
        starts = np.arange(S)
    ends = np.append(starts[1:], S)
    rows = [{"step": int(s), "end": int(ends[i]), "bucket": int(round(per["bucket"][i])), "buckets": int(per["buckets"][i]),
             "batch": _r(per["batch"][i], 2), "time_max": _r(per["time_max"][i], 4),
             "time_mean": _r(per["time_mean"][i], 4), "balance": _r(per["balance"][i], 4)}
            for i, s in enumerate(starts)]
    return rows, w


def share_table(n: npt.NDArray[np.int64], seconds: npt.NDArray[np.float64], names: Sequence[str]
                ) -> list[dict[str, Any]]:
    """Rows of the corpus shares: per epoch (a row of ``n`` / ``seconds``, one column per
    corpus of ``names``) and corpus, the share of the epoch's planned utterances and hours,
    largest first (more than :data:`MAX_GROUPS` corpora: the smallest in one row)."""
    out = []
    for e in range(n.shape[0]):
        ne, h = n[e], seconds[e]
        order = np.argsort(-h, kind="stable")
        folded = len(names) > MAX_GROUPS
        for c in (order[:MAX_GROUPS - 1] if folded else order):
            if ne[c]:
                out.append({"epoch": e, "corpus": names[c], "share": _r(ne[c] / ne.sum()),
                            "hours_share": _r(h[c] / h.sum()) if h.sum() else 0.0})
        if folded:
            rest = order[MAX_GROUPS - 1:]
            out.append({"epoch": e, "corpus": f"(other: {len(rest)} corpora)", "share": _r(ne[rest].sum() / ne.sum()),
                        "hours_share": _r(h[rest].sum() / h.sum()) if h.sum() else 0.0})
    return out


def _leaf_weights(node: Any, path: tuple[float, ...] = ()) -> dict[str, str]:
    """Each corpus of a blend tree (``plan.json``'s ``weights.tree``) with its weight down its
    path ("0.7 × 960" when nested; "-" where a list mixes without weights)."""
    if not isinstance(node, dict):
        return {}
    here = path + ((node["weight"],) if isinstance(node.get("weight"), (int, float)) else ())
    if "corpus" in node:
        return {str(node["corpus"]): " × ".join(f"{w:g}" for w in here) or "-"}
    out: dict[str, str] = {}
    for child in node.get("children") or []:
        out.update(_leaf_weights(child, here))
    return out


def target_table(weights: dict[str, Any], n: npt.NDArray[np.int64], seconds: npt.NDArray[np.float64],
                 names: Sequence[str]) -> list[dict[str, Any]]:
    """Per corpus of a weighted plan (``weights``: ``plan.json``'s ``weights``): its weight in
    the blend, the target probability ``p`` and quota per epoch, and the shares of each
    epoch's planned utterances it got (epoch 0, and the fewest and most over the epochs of
    ``n``), with epoch 0's share of hours; ``achieved - target`` in share points."""
    leaf = _leaf_weights(weights.get("tree"))
    index = {c: i for i, c in enumerate(names)}
    out = []
    for c in weights.get("corpora") or []:
        name = str(c["corpus"])
        i = index.get(name)
        share = (n[:, i] / np.maximum(n.sum(axis=1), 1)) if i is not None else np.zeros(n.shape[0])
        hours = (seconds[0, i] / seconds[0].sum()) if i is not None and n.shape[0] and seconds[0].sum() else 0.0
        target = float(c["probability"])
        out.append({"corpus": name, "weight": leaf.get(name, "-"), "target": _r(target), "quota": int(c["quota"]),
                    "rows": int(c["rows"]), "achieved": _r(float(share[0]) if share.size else 0.0),
                    "achieved_min": _r(float(share.min()) if share.size else 0.0),
                    "achieved_max": _r(float(share.max()) if share.size else 0.0),
                    "hours_share": _r(float(hours)), "difference": _r((float(share[0]) if share.size else 0.0) - target)})
    return out


def corpus_shares(plan_dir: str | os.PathLike[str], meta: PlanMeta, corp: CorpusCodes, rows: SpillFiles,
                  num_rows: int, memory_limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per epoch (the first :data:`MAX_SHARE_EPOCHS`) and corpus: the share of the epoch's
    planned utterances and hours, and for a weighted plan each corpus's target against what it
    got (:func:`target_table`); both empty for a single-corpus manifest. ``rows``: each row's
    corpus code and duration (:func:`spill_rows`), read back in ranges of
    :func:`share_range_rows` rows, each joined to the epoch's planned rows of that range
    (spilled by range: :func:`spill_planned_rows`; hours summed in manifest row order,
    :class:`CorpusShares`)."""
    names = corp.names
    if len(names) < 2:
        return [], []
    acc = CorpusShares(min(meta.epochs, MAX_SHARE_EPOCHS), len(names))
    step = share_range_rows(memory_limit)
    for e in range(acc.n.shape[0]):
        planned = HeldColumns() if isinstance(rows, HeldColumns) else SpillFiles(rows.root / f"epoch{e}")
        if not isinstance(planned, HeldColumns):
            planned.root.mkdir()
        spill_planned_rows(plan_dir, meta, e, step, planned)
        for k, a in enumerate(range(0, num_rows, step)):
            b = min(a + step, num_rows)
            code = corp.order[rows.read_range("c", np.int32, a, b)]
            d = rows.read_range("d", np.float64, a, b)
            acc.add(e, code, d, planned_times(planned, k, b - a))
        if not isinstance(planned, HeldColumns):
            remove_spill(planned.root)
    weights = meta.extra.get("weights")
    targets = target_table(weights, acc.n, acc.seconds, names) if isinstance(weights, dict) else []
    return share_table(acc.n, acc.seconds, names), targets


def plan_aggregates(plan_dir: str | os.PathLike[str], meta: PlanMeta, corp: CorpusCodes, rows: SpillFiles,
                    num_rows: int, memory_limit: int, world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
                    cost: CostModel | None = None, manifest: str | os.PathLike[str] | None = None) -> PlanAggregates:
    """Section 3 for a plan of the manifest whose corpora and rows (:func:`corpus_shares`)
    were read already; epoch 0's batches (per-batch columns, not their rows) are read once
    and shared by every figure."""
    cost = cost or CostModel()
    m = read_epoch_batches(plan_dir, 0, rows=False)
    times = cost.step_time(m["size"], m["max_duration"], m["max_tokens"])
    steps, window = _step_rows(m["bucket"], m["size"], m["max_duration"], times)
    W = meta.world_size
    ranks = [{"rank": r, "batches": int(m["size"].shape[0]), "utterances": int(m["size"][:, r].sum()),
              "padded_hours": _r(float((m["size"][:, r] * m["max_duration"][:, r]).sum()) / 3600.0, 4),
              "predicted_s": _r(float(times[:, r].sum()), 3)} for r in range(W)]
    rep = plan_steps_report(plan_dir, cost, batches=m).to_json()
    sims = [s.to_json() for s in simulate_plan(plan_dir, world_sizes, cost, batches=m)]
    summary = {"world_size": W, "epochs": meta.epochs, "steps": meta.num_steps,
               "steps_per_epoch": meta.steps_per_epoch, "seed": meta.seed, "interleave": meta.interleave,
               "balance_tolerance": meta.balance.tolerance if meta.balance else 0.0,
               "padding_audio": meta.padding.get("audio"), "padding_tokens": meta.padding.get("tokens"),
               "dropped_rows": meta.fallbacks.get("dropped_rows", 0), "moved_rows": meta.fallbacks.get("moved_rows", 0),
               "plan_hash": meta.plan_hash, "epoch0": rep}
    shares, targets = corpus_shares(plan_dir, meta, corp, rows, num_rows, memory_limit)
    return PlanAggregates(summary, steps, window, ranks, shares,
                          [{k: (_r(v, 6) if isinstance(v, float) else v) for k, v in s.items()} for s in sims], targets,
                          store_rows(plan_dir, manifest) if manifest is not None else [])
