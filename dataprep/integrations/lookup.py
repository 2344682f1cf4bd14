"""Trace a plan step to its utterances (``dataprep lookup plan/ --step S [--rank R]``).

Seeks, never scans: each asked rank's shard reads the one row group that holds step ``S`` and
only that group's footer metadata (the shard's step index, :mod:`manifests.step_index`, kept
under ``cache_dir`` beside the row cache), and the step's manifest rows come from the memory-mapped
row cache (:class:`~dataprep.integrations.rows.ManifestRows`, built once per manifest and
shared with the samplers). The manifest must be the plan's (content hash checked). One
:class:`StepBatch` per rank: the batch's bucket, epoch and padded shape, and its utterances in
batch order with the manifest's id, corpus, duration (seconds), tokens and where the audio is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests.errors import DataprepError
from manifests.hash_cache import require_manifest_hash
from manifests.options import check_int
from manifests.plan_files import PlanShard
from manifests.plan_meta import PlanMeta, read_plan_meta

#: manifest fields of each utterance a lookup reports, in order (absent columns read as None)
UTTERANCE_FIELDS = ("id", "corpus", "duration", "num_tokens", "audio_path", "offset", "container", "lang", "text")


@dataclass(frozen=True)
class StepBatch:
    """One rank's batch at a step: where it sits in the plan and its utterances (dicts of
    :data:`UTTERANCE_FIELDS`; ``duration`` / ``offset`` in seconds, ``num_tokens`` in tokens)."""

    rank: int
    step: int
    epoch: int
    step_in_epoch: int
    bucket: int
    utterances: list[dict[str, Any]]

    @property
    def audio_seconds(self) -> float:
        """Audio in the batch (seconds, unpadded)."""
        return float(sum(u["duration"] or 0.0 for u in self.utterances))

    def to_json(self) -> dict[str, Any]:
        """The batch as a JSON-ready dict (what ``dataprep lookup --json`` prints)."""
        return {"rank": self.rank, "step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "bucket": self.bucket, "size": len(self.utterances), "utterances": self.utterances}


def lookup_step(plan_dir: str | os.PathLike[str], step: int, ranks: Sequence[int] | None = None,
                manifest: str | os.PathLike[str] | None = None,
                cache_dir: str | os.PathLike[str] | None = None) -> list[StepBatch]:
    """The batches of global ``step`` on ``ranks`` (default: every rank), in rank order.

    ``manifest`` defaults to the plan's manifest by its recorded name next to the plan
    directory; a manifest whose content hash is not the plan's is refused. A step outside the
    plan (before a re-plan's first step, or past its last) and a rank outside the world are
    refused with one line.
    """
    from dataprep.integrations.rows import ManifestRows
    from dataprep.planning import default_manifest

    check_int("step", step, ge=0)
    meta = read_plan_meta(plan_dir)
    _check_step(plan_dir, meta, step)
    wanted = list(range(meta.world_size)) if ranks is None else list(ranks)
    for r in wanted:
        check_int("rank", r, ge=0)
        if r >= meta.world_size:
            raise DataprepError(f"{plan_dir}: rank {r} is not below the plan's world size {meta.world_size}")
    path = Path(manifest) if manifest is not None else default_manifest(plan_dir, meta)
    require_manifest_hash(path, meta.manifest.content_hash, f"the plan's manifest ({meta.manifest.file})")
    rows = ManifestRows.open(path, cache_dir)
    return [_batch_at(PlanShard(plan_dir, r, meta, at_step=step, cache_dir=cache_dir), step, rows) for r in wanted]


def _check_step(plan_dir: str | os.PathLike[str], meta: PlanMeta, step: int) -> None:
    if step >= meta.num_steps:
        raise DataprepError(f"{plan_dir}: step {step} is past the plan's last step ({meta.num_steps - 1})")
    if step < meta.first_step:
        raise DataprepError(f"{plan_dir}: step {step} precedes this re-plan's first step {meta.first_step}; "
                            "look it up in the plan it was re-planned from")


def _batch_at(shard: PlanShard, step: int, rows: Any) -> StepBatch:
    batch = next(shard.iter_batches(start_step=step), None)
    if batch is None or batch.step != step:
        raise DataprepError(f"{shard.path}: holds no batch for step {step} (corrupt shard; run `dataprep verify`)")
    records = rows.records(batch.rows)
    utterances = [{k: rec.get(k) for k in UTTERANCE_FIELDS} for rec in records]
    for u, plan_id in zip(utterances, batch.ids):
        if u["id"] != plan_id:
            raise DataprepError(f"{shard.path}: step {step} names {plan_id!r} where the manifest row holds "
                                f"{u['id']!r} (plan made from another manifest?)")
    return StepBatch(shard.rank, step, batch.epoch, batch.step_in_epoch, batch.bucket, utterances)
