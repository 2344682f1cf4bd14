"""The tail-worker simulation of a written plan: read one epoch's batches from the rank
shards, cost each with :class:`bucketing.costmodel.CostModel`, and compare synchronized and
unsynchronized step times with :func:`bucketing.simulate.simulate`. With the manifest, what
each rank-step reads from a store (:func:`store_reads`: requests and bytes, coalesced as the
prefetch reads them) and what a :class:`~dataprep.planning.step_reads.StoreModel` predicts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from bucketing.step_figures import PlanReport, plan_report, step_warnings
from bucketing.costmodel import CostModel
from bucketing.simulate import SimResult, StrategyResult, simulate, simulate_strategy
from dataprep.planning.step_reads import DEFAULT_MAX_GAP, StoreModel, coalesce
from manifests import storage
from manifests.errors import DataprepError, ManifestError, OptionError
from manifests.hash_cache import require_manifest_hash
from manifests.manifest_read import read_manifest
from manifests.options import MAX_COUNT, check_int, check_number
from manifests.plan_files import PlanShard
from manifests.plan_meta import PlanMeta, read_plan_meta
from dataprep.planning.options import check_rank_speed

DEFAULT_WORLD_SIZES = (2, 16, 128)
#: Largest ``slow`` factor and ``exchange`` time (seconds) a simulation takes: beyond them the
#: figures are meaningless (and products overflow to infinity).
MAX_SLOW_FACTOR = 1e6
MAX_EXCHANGE_S = 1e6


def _check_epoch(epoch: object, epochs: int) -> None:
    check_int("epoch", epoch, ge=0)
    if epoch >= epochs:  # type: ignore[operator]
        raise OptionError("epoch", f"the plan has epochs 0..{epochs - 1}, got {epoch}")


def read_epoch_batches(plan_dir: str | os.PathLike[str], epoch: int = 0, rows: bool = True) -> dict[str, np.ndarray]:
    """Per-batch columns of one epoch over all ranks, as (steps, ranks) matrices, and with
    ``rows`` each rank's ``rows`` (Arrow lists: every row of the epoch, 8 bytes each). A packed
    plan's batches as sequences: ``size`` sequences, ``max_duration`` at most a sequence's
    audio (longest member x most members), ``max_tokens`` the most token-equivalents."""
    meta = read_plan_meta(plan_dir)
    _check_epoch(epoch, meta.epochs)
    W = meta.world_size
    cols = ["epoch", "step", "bucket", "size", "max_duration", "max_tokens", *(["rows"] if rows else [])]
    parts = []
    for r in range(W):
        t = PlanShard(plan_dir, r, meta).read_epoch(epoch, cols)
        parts.append(t)
    S = parts[0].num_rows
    if S == 0:
        raise ManifestError(f"{plan_dir}: epoch {epoch} is not in the plan (epochs: {meta.epochs})")
    out = {c: np.stack([p.column(c).to_numpy() for p in parts], axis=1)
           for c in ("bucket", "size", "max_duration", "max_tokens")}
    if "pack" in meta.extra:  # batches of sequences, as the planner costed them
        for r in range(W):
            out["size"][:, r], out["max_duration"][:, r], out["max_tokens"][:, r] = _packed_figures(
                PlanShard(plan_dir, r, meta).read_epoch(epoch, ["max_duration", "sequence", "cu_seqlens"]))
    if rows:
        out["rows"] = [p.column("rows").combine_chunks() for p in parts]  # type: ignore[assignment]
    return out


def _packed_figures(t: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch of a packed shard table: sequences, an upper bound of a sequence's audio
    (longest member x most members of a sequence, s) and its most token-equivalents."""
    seq, cu = t.column("sequence").combine_chunks(), t.column("cu_seqlens").combine_chunks()
    s_off, c_off = np.asarray(seq.offsets, dtype=np.int64), np.asarray(cu.offsets, dtype=np.int64)
    s_val, c_val = np.asarray(seq.flatten(), dtype=np.int64), np.asarray(cu.flatten(), dtype=np.int64)
    n = np.diff(c_off) - 1
    batch = np.repeat(np.arange(n.shape[0]), np.diff(s_off))
    first = np.concatenate([[0], np.cumsum(n)[:-1]])
    members = np.bincount(first[batch] + s_val, minlength=int(n.sum()))
    most_members = np.maximum.reduceat(members, first)
    grow = np.diff(c_val)
    keep = np.ones(grow.shape[0], dtype=bool)
    keep[c_off[1:-1] - 1] = False
    most_te = np.maximum.reduceat(grow[keep], first)
    return n, t.column("max_duration").to_numpy() * most_members, most_te


def simulate_plan(
    plan_dir: str | os.PathLike[str],
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
    cost: CostModel | None = None,
    manifest: str | os.PathLike[str] | None = None,
    epoch: int = 0,
    seed: int = 0,
    batches: dict[str, np.ndarray] | None = None,
    speed: Sequence[float] | None = None,
) -> list[SimResult]:
    """Tail-worker simulation of one epoch of a plan: at the plan's world size with its own
    step layout, and at each of ``world_sizes`` by re-dealing the same batches (one bucket
    per step when synchronized, random buckets per rank when not).

    With ``manifest`` (which must be the plan's, by content hash), batch lengths are
    recomputed from it instead of read from the shards. A packed plan's batches are costed as
    its sequences (:func:`read_epoch_batches`). ``batches``: that epoch's
    :func:`read_epoch_batches`, when the caller has read them already. ``speed``: each rank's
    relative speed at the plan's world size (default: the plan's ``rank_speed``, else alike).
    """
    for w in world_sizes:  # before anything is read or allocated (an array per world size)
        check_int("world_sizes", w, ge=1, le=MAX_COUNT)
    check_int("seed", seed, ge=0, le=2**63 - 1)
    if cost is not None and not isinstance(cost, CostModel):
        raise OptionError("cost", f"must be a CostModel, got {type(cost).__name__}")
    cost = cost or CostModel()
    meta = read_plan_meta(plan_dir)
    _check_epoch(epoch, meta.epochs)
    W = meta.world_size
    m = batches if batches is not None else read_epoch_batches(plan_dir, epoch)
    max_d, max_t = m["max_duration"], m["max_tokens"]
    if manifest is not None:
        require_manifest_hash(manifest, meta.manifest.content_hash, "the plan's manifest")
    if manifest is not None and "pack" not in meta.extra:  # packed: the sequences' figures above
        df = read_manifest(manifest, columns=["duration", "num_tokens"])
        d = df["duration"].to_numpy()
        tk = df["num_tokens"].fill_null(0).to_numpy().astype(np.int64)
        max_d = np.empty_like(max_d)
        max_t = np.empty_like(max_t)
        for r, col in enumerate(m["rows"]):  # type: ignore[arg-type]
            rows = col.values.to_numpy()
            starts = col.offsets.to_numpy()[:-1]
            max_d[:, r] = np.maximum.reduceat(d[rows], starts)
            max_t[:, r] = np.maximum.reduceat(tk[rows], starts)
    times = cost.step_time(m["size"], max_d, max_t)
    own = times / rank_speeds(meta, speed)[None, :]  # the plan's steps on its ranks
    results = []
    for w in dict.fromkeys([W, *world_sizes]):
        results.append(simulate(m["bucket"].ravel(), times.ravel(), w, seed=seed,
                                sync_matrix=own if w == W else None, overhead=cost.overhead))
    return results


def simulate_with_warnings(
    plan_dir: str | os.PathLike[str],
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
    cost: CostModel | None = None,
    manifest: str | os.PathLike[str] | None = None,
    epoch: int = 0,
    seed: int = 0,
    speed: Sequence[float] | None = None,
) -> tuple[list[SimResult], list[str]]:
    """:func:`simulate_plan` at the world sizes the epoch's batches can fill (other ones are
    skipped), and one-line warnings: each world size skipped, and why speedups at world sizes
    with fewer batches per bucket than ranks say little (re-split tails, not training)."""
    for w in world_sizes:
        check_int("world_sizes", w, ge=1, le=MAX_COUNT)
    W = read_plan_meta(plan_dir).world_size
    m = read_epoch_batches(plan_dir, epoch)
    batches = int((m["size"] > 0).sum())
    fill = [w for w in world_sizes if w <= batches or w == W]
    warnings = [f"world size {w} skipped: epoch {epoch} holds {batches:,} batches, fewer than {w} ranks to fill"
                for w in dict.fromkeys(world_sizes) if w not in fill]
    results = simulate_plan(plan_dir, fill, cost, manifest=manifest, epoch=epoch, seed=seed, batches=m, speed=speed)
    thin = [r for r in results if not r.representative]
    if thin:
        per = min(r.batches_per_bucket for r in thin)
        warnings.append(f"world size(s) {', '.join(str(r.world_size) for r in thin)}: about {per:.0f} batch(es) per "
                        "bucket, fewer than ranks: synchronized steps are mostly a bucket's batches split over "
                        "idle ranks, so their speedups (negative ones included) describe this small corpus, not "
                        "training at that scale")
    return results, warnings


def plan_warnings(meta: PlanMeta) -> list[str]:
    """Where a written plan will be poor (:func:`bucketing.step_figures.step_warnings`): few
    steps an epoch, a straggler beyond what its world size can be filled for."""
    spe = meta.steps_per_epoch
    return step_warnings(meta.world_size, min(spe) if spe else 0,
                         meta.balance.straggler if meta.balance is not None else None)


def rank_speeds(meta: PlanMeta, speed: Sequence[float] | None = None) -> npt.NDArray[np.float64]:
    """Each rank's relative speed: ``speed`` (one finite number > 0 per rank of the plan), else
    the plan's ``rank_speed`` (``plan-batches --rank-speed``), else 1 for every rank."""
    if speed is None:
        recorded = meta.extra.get("rank_speed")
        speed = recorded if isinstance(recorded, list) and len(recorded) == meta.world_size else None
    if speed is None:
        return np.ones(meta.world_size)
    check_rank_speed(list(speed), meta.world_size)
    return np.asarray(speed, dtype=np.float64)


def plan_steps_report(plan_dir: str | os.PathLike[str], cost: CostModel | None = None, epoch: int = 0,
                      batches: dict[str, np.ndarray] | None = None, speed: Sequence[float] | None = None) -> PlanReport:
    """Fill, straggler, same-bucket share and padded-audio balance of one epoch of a written
    plan, at its own world size and step layout (:func:`bucketing.step_figures.plan_report`);
    ``batches`` and ``speed`` as in :func:`simulate_plan`."""
    meta = read_plan_meta(plan_dir)
    m = batches if batches is not None else read_epoch_batches(plan_dir, epoch)
    return plan_report(m["bucket"], m["size"], m["max_duration"], m["max_tokens"], meta.batch_sizes, cost,
                       rank_speeds(meta, speed))


@dataclass(frozen=True)
class PackReport:
    """Slot use of one epoch of a packed plan: ``sequences`` (over all ranks), ``members``
    (rows), ``slot_use`` (Σ members' token-equivalents ÷ sequences × N), ``sequences_per_batch``
    and ``members_per_sequence`` (means), ``fullest`` / ``emptiest`` sequence (share of N)."""

    max_tokens: int
    sequences: int
    members: int
    slot_use: float
    sequences_per_batch: float
    members_per_sequence: float
    fullest: float
    emptiest: float


def pack_report(plan_dir: str | os.PathLike[str], epoch: int = 0) -> PackReport | None:
    """:class:`PackReport` of ``epoch`` of a packed plan (None: the plan is not packed), read
    from the shards' ``cu_seqlens`` a row group at a time."""
    meta = read_plan_meta(plan_dir)
    entry = meta.extra.get("pack")
    if not isinstance(entry, dict):
        return None
    _check_epoch(epoch, meta.epochs)
    cap = int(entry["max_tokens"])
    seqs = members = batches = 0
    te = np.zeros(0, dtype=np.int64)
    parts = []
    for r in range(meta.world_size):
        t = PlanShard(plan_dir, r, meta).read_epoch(epoch, ["size", "cu_seqlens"])
        cu = t.column("cu_seqlens").combine_chunks()
        off = np.asarray(cu.offsets, dtype=np.int64)
        val = np.asarray(cu.flatten(), dtype=np.int64)
        grow = np.diff(val)
        keep = np.ones(grow.shape[0], dtype=bool)
        keep[off[1:-1] - 1] = False  # steps across batches
        parts.append(grow[keep])
        batches += t.num_rows
        members += int(pc_sum(t.column("size")))
    te = np.concatenate(parts) if parts else te
    seqs = int(te.shape[0])
    return PackReport(cap, seqs, members, float(te.sum()) / (seqs * cap) if seqs else 1.0,
                      seqs / max(batches, 1), members / max(seqs, 1),
                      float(te.max(initial=0)) / cap, float(te.min()) / cap if seqs else 0.0)


def pc_sum(column: object) -> int:
    """Sum of an integer Arrow column."""
    import pyarrow.compute as pc

    got = pc.sum(column).as_py()  # type: ignore[arg-type]
    return int(got or 0)


def simulate_strategies(
    plan_dir: str | os.PathLike[str],
    strategies: Sequence[str],
    cost: CostModel | None = None,
    group_size: int | None = None,
    slow: dict[int, float] | None = None,
    exchange: float = 0.005,
    epoch: int = 0,
    speed: Sequence[float] | None = None,
) -> list[StrategyResult]:
    """One epoch of a plan under each of ``strategies`` (sync | adpsgd | hybrid,
    :func:`bucketing.simulate.simulate_strategy`); ``group_size`` for hybrid defaults to the
    plan's ``sync_group`` (else 8 when it divides the world size, else all ranks). ``slow``:
    ``{rank: factor}``, a rank of the plan and a finite factor in (0, :data:`MAX_SLOW_FACTOR`];
    ``exchange``: seconds in [0, :data:`MAX_EXCHANGE_S`]; ``speed`` as in :func:`simulate_plan`."""
    if cost is not None and not isinstance(cost, CostModel):
        raise OptionError("cost", f"must be a CostModel, got {type(cost).__name__}")
    cost = cost or CostModel()
    check_int("group_size", group_size, ge=1, optional=True)
    check_number("exchange", exchange, ge=0, le=MAX_EXCHANGE_S)
    if slow is not None and not isinstance(slow, dict):
        raise OptionError("slow", f"must be a dict of rank -> factor, got {type(slow).__name__}")
    meta = read_plan_meta(plan_dir)
    W = meta.world_size
    _check_epoch(epoch, meta.epochs)
    for rank, factor in (slow or {}).items():
        check_int("slow", rank, ge=0, le=W - 1)
        check_number("slow", factor, gt=0, le=MAX_SLOW_FACTOR)
    if group_size is None:
        group_size = meta.sync_group or (8 if W % 8 == 0 and W > 8 else W)
    m = read_epoch_batches(plan_dir, epoch)
    times = cost.step_time(m["size"], m["max_duration"], m["max_tokens"]) / rank_speeds(meta, speed)[None, :]
    out = []
    for st in strategies:
        try:
            out.append(simulate_strategy(times, m["size"], st, group_size, exchange, slow))
        except ValueError as exc:
            raise DataprepError(f"{plan_dir}: {exc}") from None
    return out


@dataclass(frozen=True)
class StoreReads:
    """What one epoch of a plan reads from a store, per rank-step (one rank's batch of one
    step): ``requests`` and ``nbytes`` (steps x ranks), ``used`` (bytes of the rows' audio,
    shared ranges once), ``objects`` (containers or files touched); and the store model's time
    to first batch (s, the slowest rank's first step read alone) and input throughput of the
    slowest rank (steps/s, utterances/s). Parquet audio rows are not counted (``unpriced``)."""

    requests: np.ndarray
    nbytes: np.ndarray
    used: np.ndarray
    objects: np.ndarray
    rows: np.ndarray
    unpriced: int
    store: StoreModel
    first_batch_s: float
    steps_per_s: float
    utt_per_s: float

    @property
    def fetched_per_used(self) -> float:
        return float(self.nbytes.sum() / max(1, self.used.sum()))


def _object_sizes(names: list[str]) -> np.ndarray:
    """Sizes (bytes) of whole loose files (local or URLs), asked with bounded concurrency."""
    with ThreadPoolExecutor(storage.MAX_CONCURRENCY) as pool:  # a stat per file: I/O, not arithmetic
        return np.fromiter(pool.map(lambda n: storage.stat(n).size, names), np.int64, count=len(names))


def _addresses(manifest: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per manifest row: object code, byte range ``[start, end)`` and whether it is priced."""
    df = read_manifest(manifest, columns=["audio_path"], optional=["container", "member_offset", "member_size"])
    n = df.height
    container = df["container"] if "container" in df.columns else pl.Series([None] * n, dtype=pl.String)
    off = (df["member_offset"] if "member_offset" in df.columns else pl.Series([None] * n, dtype=pl.Int64))
    size = (df["member_size"] if "member_size" in df.columns else pl.Series([None] * n, dtype=pl.Int64))
    tar = (container.is_not_null() & off.is_not_null() & (off.fill_null(-1) >= 0)).to_numpy()
    loose = container.is_null().to_numpy()
    name = pl.Series(np.where(loose, df["audio_path"].to_numpy(), container.fill_null("").to_numpy()))
    uniq, code = np.unique(name.to_numpy().astype(str), return_inverse=True)
    code = code.reshape(-1).astype(np.int64)
    start = np.where(tar, off.fill_null(0).to_numpy(), 0).astype(np.int64)
    end = np.where(tar, start + size.fill_null(0).to_numpy(), 0).astype(np.int64)
    if loose.any():
        files = np.unique(code[loose])
        sizes = _object_sizes([str(uniq[i]) for i in files.tolist()])
        end[loose] = sizes[np.searchsorted(files, code[loose])]
    return code, start, end, tar | loose


def store_reads(plan_dir: str | os.PathLike[str], manifest: str | os.PathLike[str], epoch: int = 0,
                store: StoreModel | None = None, max_gap: int = DEFAULT_MAX_GAP,
                batches: dict[str, np.ndarray] | None = None) -> StoreReads:
    """Requests and bytes of every rank-step of one epoch (each step's ranges of one object
    within ``max_gap`` bytes one request: :func:`~dataprep.planning.step_reads.coalesce`,
    as the prefetch reads them) and the ``store`` model's predictions (:class:`StoreReads`)."""
    store = store or StoreModel()
    if not isinstance(store, StoreModel):
        raise OptionError("store", f"must be a StoreModel, got {type(store).__name__}")
    meta = read_plan_meta(plan_dir)
    require_manifest_hash(manifest, meta.manifest.content_hash, "the plan's manifest")
    m = batches if batches is not None and "rows" in batches else read_epoch_batches(plan_dir, epoch)
    code, start, end, priced = _addresses(manifest)
    objects_total = int(code.max()) + 1 if code.size else 1
    S, W = m["size"].shape
    shape = (S, W)
    req, nbytes, used, objs, nrows = (np.zeros(shape, np.int64) for _ in range(5))
    for r, col in enumerate(m["rows"]):  # type: ignore[arg-type]
        rows = col.values.to_numpy()
        step = np.repeat(np.arange(S), np.diff(col.offsets.to_numpy()))
        nrows[:, r] = np.bincount(step, minlength=S)
        keep = priced[rows]
        rows, step = rows[keep], step[keep]
        key = step.astype(np.int64) * objects_total + code[rows]
        got = coalesce(key, start[rows], end[rows], max_gap)
        req[:, r] = np.bincount(got.obj // objects_total, minlength=S)
        nbytes[:, r] = np.bincount(got.obj // objects_total, weights=got.end - got.start, minlength=S)
        exact = coalesce(key, start[rows], end[rows], 0)
        used[:, r] = np.bincount(exact.obj // objects_total, weights=exact.end - exact.start, minlength=S)
        objs[:, r] = np.bincount(np.unique(key) // objects_total, minlength=S)
    unpriced = int((~priced).sum())
    first = float(store.step_seconds(req[0], nbytes[0]).max()) if S else 0.0
    rates = [store.steps_per_second(req[:, r], nbytes[:, r]) for r in range(W)]
    slow = int(np.argmin(rates)) if rates else 0
    steps_per_s = float(rates[slow]) if rates else 0.0
    utt = steps_per_s * float(nrows[:, slow].mean()) if S else 0.0
    return StoreReads(req, nbytes, used, objs, nrows, unpriced, store, first, steps_per_s, utt)
