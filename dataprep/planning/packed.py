"""Packed plans (``plan-batches --pack N``): the manifest's rows packed into sequences of at
most N token-equivalents (:mod:`bucketing.packing`, per bucket; text-only rows, duration 0,
fill the gaps), the sequences planned as rows of their bucket by :func:`build_plan` (so every
property of a plan holds for them: once per epoch, equal steps, balance under the cost model,
determinism, resume) and each shard batch of sequences expanded into its members
(:class:`PackedShards`): shard version 3 with ``sequence`` and ``cu_seqlens``.

A sequence enters the planner as one row of its members' total audio (s) and total
token-equivalents; a bucket's batch holds ``sequences_per_batch`` sequences, or its batch size
over the most speech members a sequence of it holds (so a batch holds no more utterances of
audio than the bucket was sized for). Rows over N are left out with reason ``exceeds_pack``.
Memory: the manifest's ids, durations and tokens plus the packing, about
:data:`PACK_BYTES_PER_ROW` a row (checked against ``--memory-limit``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from bucketing.allocate import allocate
from bucketing.batching import TOTALS_BLOCK
from bucketing.fit import grid_from_spec
from bucketing.packing import Packing, pack_rows, token_equivalents
from dataprep.planning.options import PlanOptions
from manifests.arrow_views import numeric_values, single_chunk
from manifests.buckets_file import BucketSpec, read_buckets, write_buckets
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import iter_manifest
from manifests.manifest_write import write_parquet_stream
from manifests.plan_files import SHARD_SCHEMA_PACKED
from manifests.plan_meta import FileRef, ManifestRef, PlanMeta
from manifests.spill import remove_spill, spill_dir

#: Bytes of memory a row of a packed plan holds: duration, tokens, te, bucket, its place in the
#: packing and the packing's sorts (about 70), plus its id (counted apart).
PACK_BYTES_PER_ROW = 100
#: Microseconds: audio seconds are summed as integers of these, so the figures do not depend
#: on the order (threads) in which shards are written.
_US = 1_000_000
_SEQ_SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("duration", pa.float64(), nullable=False),
                         pa.field("num_tokens", pa.int32(), nullable=False), pa.field("bucket", pa.int32(), nullable=False)])


@dataclasses.dataclass
class PackedRows:
    """The manifest's rows as the packing sees them: ids, duration (s), tokens, te, each row's
    bucket (-1: left out or text) and the rows left out by reason."""

    ids: pa.ChunkedArray
    duration: npt.NDArray[np.float64]
    tokens: npt.NDArray[np.int32]
    te: npt.NDArray[np.int64]
    bucket: npt.NDArray[np.int32]
    text: npt.NDArray[np.bool_]
    left_out: dict[str, npt.NDArray[np.int64]]
    moved: int = 0
    raised: int = 0


def read_packed_rows(manifest: str | os.PathLike[str], spec: BucketSpec, options: PlanOptions,
                     limit: int) -> PackedRows:
    """The manifest's rows allocated to ``spec``'s buckets (text rows, duration 0, to none) and
    their token-equivalents; rows over ``options.pack`` left out as ``exceeds_pack``."""
    grid = grid_from_spec(spec)
    ids, d, t, b = [], [], [], []
    dropped: dict[str, list[npt.NDArray[np.int64]]] = {}
    moved = raised = base = 0
    id_bytes = 0
    for table in iter_manifest(manifest, ["id", "duration", "num_tokens"], TOTALS_BLOCK):
        dk = numeric_values(table.column("duration"), np.float64)
        tk = numeric_values(table.column("num_tokens"), np.int32)
        speech = dk != 0  # a duration of 0 is a text-only row
        alloc = allocate(dk[speech], tk[speech], grid, strict=options.strict)
        bk = np.full(dk.shape[0], -1, dtype=np.int32)
        bk[speech] = alloc.bucket
        where = np.flatnonzero(speech)
        for reason, rows in alloc.dropped.items():
            dropped.setdefault(reason, []).append(where[rows] + base)
        moved, raised = moved + alloc.moved, raised + alloc.raised
        ids.append(single_chunk(table.column("id")))
        id_bytes += ids[-1].nbytes
        d.append(dk.copy())
        t.append(tk.copy())
        b.append(bk)
        base += table.num_rows
        need = base * PACK_BYTES_PER_ROW + id_bytes
        if need > limit:
            raise DataprepError(f"{manifest}: --memory-limit: a packed plan holds about {PACK_BYTES_PER_ROW} bytes a "
                                f"row plus its id: more than {limit / 2**30:.2f} GiB from row {base:,} on; "
                                "raise --memory-limit")
    if base == 0:
        raise DataprepError(f"{manifest}: the manifest has no rows")
    dur, tok, bucket = np.concatenate(d), np.concatenate(t), np.concatenate(b)
    te = token_equivalents(dur, tok, options.audio_token_rate)
    text = dur == 0
    over = te > int(options.pack)  # type: ignore[arg-type]
    left_out = {k: np.sort(np.concatenate(v)) for k, v in dropped.items()}
    if over.any():
        left_out["exceeds_pack"] = np.flatnonzero(over & (text | (bucket >= 0)))
    bucket[over] = -1
    text &= ~over
    return PackedRows(pa.chunked_array(ids, pa.string()), dur, tok, te, bucket, text, left_out, moved, raised)


def sequences_per_batch(packing: Packing, speech_members: npt.NDArray[np.int64], bs: npt.NDArray[np.int64],
                        fixed: int | None) -> npt.NDArray[np.int64]:
    """Sequences per batch of each bucket: ``fixed``, else the bucket's batch size over the most
    speech members a sequence of it holds (at least 1)."""
    if fixed is not None:
        return np.full(bs.shape[0], int(fixed), dtype=np.int64)
    most = np.zeros(bs.shape[0], dtype=np.int64)
    np.maximum.at(most, np.maximum(packing.bucket, 0), speech_members)
    return np.maximum(1, bs // np.maximum(most, 1))


def members_at(offsets: npt.NDArray[np.int64], seqs: npt.NDArray[np.int64]
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Positions in the packing's members of sequences ``seqs`` (CSR ``offsets``), sequence
    after sequence, and each sequence's count."""
    cnt = offsets[seqs + 1] - offsets[seqs]
    ends = np.cumsum(cnt)
    total = int(ends[-1]) if ends.shape[0] else 0
    return np.arange(total, dtype=np.int64) + np.repeat(offsets[seqs] - (ends - cnt), cnt), cnt


class PackedShards:
    """Expands shard tables of sequences into their members (:meth:`expand`, thread-safe: the
    totals are integers, added under no particular order) and describes the members in
    ``plan.json`` (:meth:`meta`)."""

    def __init__(self, rows: PackedRows, packing: Packing, member_rows: npt.NDArray[np.int64],
                 entry: dict[str, Any], meta_fields: Callable[[PlanMeta], dict[str, Any]]) -> None:
        self.rows, self.packing, self.member_rows = rows, packing, member_rows
        self.entry, self.meta_fields = entry, meta_fields
        self.us = np.round(rows.duration * _US).astype(np.int64)
        self._parts: list[npt.NDArray[np.int64]] = []

    def expand(self, table: pa.Table) -> pa.Table:
        """One shard table of sequences (``rows``: sequence numbers) as one of their members."""
        col = single_chunk(table.column("rows"))
        off = np.asarray(col.offsets, dtype=np.int64)
        off = off - off[0]
        seqs = np.asarray(col.flatten(), dtype=np.int64)
        n, p = table.num_rows, self.packing
        pos, cnt = members_at(p.offsets, seqs)
        ends = np.cumsum(cnt)
        rows = self.member_rows[pos]
        per_batch = np.diff(off)
        m_off = np.zeros(n + 1, dtype=np.int64)
        m_off[1:] = np.concatenate([[0], ends])[off[1:]]
        seq_in_batch = np.arange(seqs.shape[0], dtype=np.int64) - np.repeat(off[:-1], per_batch)
        sequence = np.repeat(seq_in_batch, cnt)
        te = p.te[seqs]
        csum = np.cumsum(te)
        before = np.concatenate([[0], csum])[np.repeat(off[:-1], per_batch)]
        cu_off = off + np.arange(n + 1)
        cu = np.zeros(seqs.shape[0] + n, dtype=np.int64)
        cu[np.arange(seqs.shape[0]) + np.repeat(np.arange(1, n + 1), per_batch)] = csum - before
        d, us, text = self.rows.duration[rows], self.us[rows], self.rows.text[rows]
        starts = m_off[:-1]
        max_d = np.maximum.reduceat(d, starts) if rows.shape[0] else np.zeros(0)
        max_t = np.maximum.reduceat(self.rows.tokens[rows], starts) if rows.shape[0] else np.zeros(0, np.int32)
        speech = np.add.reduceat((~text).astype(np.int64), starts) if rows.shape[0] else np.zeros(0, np.int64)
        part = np.array([int(us.sum()), int((speech * np.maximum.reduceat(us, starts)).sum()) if rows.shape[0] else 0,
                         int(te.sum()), int(seqs.shape[0]) * int(self.entry["max_tokens"])], dtype=np.int64)
        self._parts.append(part)  # list.append is atomic; summed as integers in any order
        mo = pa.array(m_off.astype(np.int32))
        return pa.Table.from_arrays(
            [table.column("epoch"), table.column("step"), table.column("step_in_epoch"), table.column("bucket"),
             pa.array(np.diff(m_off).astype(np.int32)), pa.array(max_d.astype(np.float64)),
             pa.array(np.asarray(max_t, dtype=np.int32)),
             pa.ListArray.from_arrays(mo, self.rows.ids.take(pa.array(rows)).combine_chunks()),
             pa.ListArray.from_arrays(mo, pa.array(rows)),
             pa.ListArray.from_arrays(mo, pa.array(sequence.astype(np.int32))),
             pa.ListArray.from_arrays(pa.array(cu_off.astype(np.int32)), pa.array(cu.astype(np.int32)))],
            schema=SHARD_SCHEMA_PACKED)

    def meta(self, meta: PlanMeta) -> PlanMeta:
        """``meta`` of the plan of sequences, made the plan of the manifest's rows."""
        real_us, pad_us, real_te, slots = (np.sum(self._parts, axis=0) if self._parts else np.zeros(4, np.int64)).tolist()
        padding = {"audio": round(1 - real_us / pad_us, 6) if pad_us else 0.0,
                   "tokens": round(1 - real_te / slots, 6) if slots else 0.0,
                   "real_seconds": round(real_us / _US, 3), "padded_seconds": round(pad_us / _US, 3),
                   "real_tokens": int(real_te), "padded_tokens": int(slots)}
        return dataclasses.replace(meta, padding=padding, **self.meta_fields(meta),
                                   extra={**meta.extra, "pack": {**self.entry, "plan_slot_use": round(real_te / slots, 6)
                                                                 if slots else 1.0}})


@dataclasses.dataclass
class PackedCorpus:
    """A manifest packed for a plan: its rows, the sequences, each member's manifest row,
    sequences per batch of each bucket (``k``), each sequence's bucket and audio (s), and
    ``plan.json``'s ``pack`` entry."""

    rows: PackedRows
    packing: Packing
    member_rows: npt.NDArray[np.int64]
    k: npt.NDArray[np.int64]
    seq_bucket: npt.NDArray[np.int64]
    seq_audio: npt.NDArray[np.float64]
    entry: dict[str, Any]
    _seq: npt.NDArray[np.int64] | None = None

    def sequence_of(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The sequences holding manifest ``rows`` (each once, ascending)."""
        if self._seq is None:
            self._seq = np.full(self.rows.duration.shape[0], -1, dtype=np.int64)
            self._seq[self.member_rows] = np.repeat(np.arange(self.packing.num_sequences), np.diff(self.packing.offsets))
        return np.unique(self._seq[rows])

    def members_of(self, seqs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The manifest rows of sequences ``seqs``, sequence after sequence."""
        return self.member_rows[members_at(self.packing.offsets, seqs)[0]]

    def write_inputs(self, spec: BucketSpec, root: Path) -> tuple[Path, Path]:
        """The sequences as a manifest (one row each: total audio, total te, bucket) and the
        buckets with ``k`` as batch sizes, under ``root``."""
        seq_manifest, seq_buckets = root / "sequences.parquet", root / "buckets.json"
        S = self.packing.num_sequences
        table = pa.Table.from_arrays([pc.cast(pa.array(np.arange(S)), pa.string()), pa.array(self.seq_audio),
                                      pa.array(self.packing.te.astype(np.int32)),
                                      pa.array(self.seq_bucket.astype(np.int32))], schema=_SEQ_SCHEMA)
        write_parquet_stream(lambda: [table], seq_manifest, _SEQ_SCHEMA, "manifest", {})
        write_buckets(dataclasses.replace(spec, buckets=tuple(dataclasses.replace(b, batch_size=int(self.k[i]))
                                                              for i, b in enumerate(spec.buckets))), seq_buckets)
        return seq_manifest, seq_buckets

    def shards(self, meta_fields: Callable[[PlanMeta], dict[str, Any]] | None = None) -> PackedShards:
        """The shard expander of a plan of these sequences; ``meta_fields(meta)`` adds fields of
        ``plan.json`` (always: ``per_bucket``'s utterances and sequences, dropped rows)."""
        B = self.k.shape[0]
        members = np.bincount(self.seq_bucket, weights=np.diff(self.packing.offsets), minlength=B).astype(np.int64)
        sequences = np.bincount(self.seq_bucket, minlength=B)

        def fields(meta: PlanMeta) -> dict[str, Any]:
            per_bucket = [{**p, "utterances": int(members[i]), "sequences": int(sequences[i])}
                          for i, p in enumerate(meta.per_bucket)]
            fb = dict(meta.fallbacks)
            dropped = {e: self.members_of(np.asarray(seqs, dtype=np.int64)).tolist()
                       for e, seqs in fb.get("dropped", {}).items()}
            fb.update(dropped=dropped, dropped_rows=sum(len(v) for v in dropped.values()))
            return {"per_bucket": per_bucket, "fallbacks": fb, **(meta_fields(meta) if meta_fields else {})}

        return PackedShards(self.rows, self.packing, self.member_rows, self.entry, fields)


def pack_corpus(manifest: str | os.PathLike[str], spec: BucketSpec, options: PlanOptions, limit: int,
                k: npt.NDArray[np.int64] | None = None) -> PackedCorpus:
    """Read and pack ``manifest`` for ``spec``'s buckets (``options``: pack, audio_token_rate,
    seed, strict, sequences_per_batch; ``k``: sequences per batch given, e.g. a re-plan's)."""
    N = int(options.pack)  # type: ignore[arg-type]
    rows = read_packed_rows(manifest, spec, options, limit)
    use = np.flatnonzero((rows.bucket >= 0) | rows.text)
    packing = pack_rows(rows.te[use], rows.bucket[use], N, text=rows.text[use], seed=options.seed)
    if packing.num_sequences == 0:
        raise DataprepError(f"{manifest}: no row fits a packed sequence of {N} token-equivalents")
    member_rows = use[packing.members]
    seq_of = np.repeat(np.arange(packing.num_sequences), np.diff(packing.offsets))
    speech = np.bincount(seq_of, weights=~rows.text[member_rows], minlength=packing.num_sequences).astype(np.int64)
    if k is None:
        k = sequences_per_batch(packing, speech, spec.batch_sizes(), options.sequences_per_batch)
    entry = {"max_tokens": N, "audio_token_rate": float(options.audio_token_rate),
             "sequences": packing.num_sequences, "rows": int(member_rows.shape[0]),
             "text_rows": int(rows.text[member_rows].sum()),
             "slot_use": round(float(packing.te.sum()) / (packing.num_sequences * N), 6),
             "sequences_per_batch": k.tolist(),
             "sequences_per_batch_source": "option" if options.sequences_per_batch is not None else "buckets",
             "left_out_rows": int(sum(v.shape[0] for v in rows.left_out.values()))}
    return PackedCorpus(rows, packing, member_rows, k, np.maximum(packing.bucket, 0).astype(np.int64),  # text-only: bucket 0
                        np.bincount(seq_of, weights=rows.duration[member_rows], minlength=packing.num_sequences), entry)


def build_packed_plan(manifest: str | os.PathLike[str], buckets: str | os.PathLike[str],
                      out_dir: str | os.PathLike[str], options: PlanOptions, *, plan: Callable[..., PlanMeta],
                      limit: int, on_progress: Callable[[int, int], None] | None = None,
                      on_phase: Callable[[str], None] | None = None,
                      timings: dict[str, float] | None = None) -> PlanMeta:
    """A packed plan of ``manifest`` (the module docstring); ``options.pack`` is N, ``limit``
    the bytes it may hold; ``plan``: :func:`dataprep.planning.build.build_plan`, which plans
    the sequences."""
    spec = read_buckets(buckets)
    if on_phase is not None:
        on_phase("reading the manifest, packing sequences")
    packed = pack_corpus(manifest, spec, options, limit)
    rows = packed.rows
    left = {k_: v.tolist() for k_, v in sorted(rows.left_out.items())}

    def meta_fields(meta: PlanMeta) -> dict[str, Any]:
        return {"manifest": ManifestRef(Path(manifest).name, manifest_hash(manifest), int(rows.duration.shape[0])),
                "buckets_file": FileRef(Path(buckets).name, file_sha256(buckets)),
                "allocation": {"strict": options.strict, "allocated_rows": int(packed.member_rows.shape[0]),
                               "left_out": left, "moved_to_longer_bin": rows.moved, "carried_tails": 0,
                               "carry": False, "raised_max_tokens_rows": rows.raised}}

    root = spill_dir(out_dir)
    try:
        seq_manifest, seq_buckets = packed.write_inputs(spec, root)
        inner = dataclasses.replace(options, pack=None, sequences_per_batch=None,
                                    audio_token_rate=PlanOptions.audio_token_rate, carry=False, strict=False)
        return plan(seq_manifest, seq_buckets, out_dir, inner, on_progress=on_progress, on_phase=on_phase,
                    timings=timings, packed=packed.shards(meta_fields))
    finally:
        remove_spill(root)


def replan_packed(plan_dir: str | os.PathLike[str], manifest: str | os.PathLike[str],
                  out_dir: str | os.PathLike[str], options: PlanOptions, meta: PlanMeta, *, at_step: int,
                  exclude: str | os.PathLike[str] | None, replan: Callable[..., PlanMeta], limit: int) -> PlanMeta:
    """``replan`` (:func:`dataprep.planning.replan.replan`) of a packed plan: the parent's
    sequences packed again (the same manifest, buckets, N, rate and seed give the same ones),
    the unseen rows mapped to their sequences and the sequences re-planned."""
    from manifests.buckets_file import parse_buckets
    from manifests.hash_cache import require_manifest_hash

    if exclude is not None:
        raise DataprepError(f"{plan_dir}: --exclude is not available for a packed plan (an excluded row would "
                            "change its sequence); re-plan without it")
    if options.cost_equal:
        raise DataprepError(f"{plan_dir}: --cost-equal is not available for a packed plan (its batches are sized "
                            "in sequences); re-plan with --no-cost-equal")
    require_manifest_hash(manifest, meta.manifest.content_hash, "the plan's manifest")
    entry = meta.extra["pack"]
    spec = parse_buckets({"buckets": meta.buckets}, f"{plan_dir}/plan.json: buckets")
    how = PlanOptions(world_size=1, seed=meta.seed, strict=bool(meta.allocation.get("strict", False)),
                      pack=int(entry["max_tokens"]), audio_token_rate=float(entry["audio_token_rate"]))
    packed = pack_corpus(manifest, spec, how, limit, k=spec.batch_sizes())
    packed.entry["sequences_per_batch_source"] = entry.get("sequences_per_batch_source", "buckets")
    root = spill_dir(out_dir)
    try:
        seq_manifest, _ = packed.write_inputs(spec, root)
        return replan(plan_dir, seq_manifest, out_dir, dataclasses.replace(options, carry=False),
                      at_step=at_step, packed=packed)
    finally:
        remove_spill(root)
