"""``plan.json``, typed: what a plan was made from and what it holds.

:class:`PlanMeta` is written by the planner (through :class:`manifests.plan_files.PlanWriter`)
and read, validated field by field, by every consumer; :meth:`PlanMeta.to_json` gives exactly
the dict that is written (keys sorted on disk), so the file's bytes do not depend on this class.

Fields (units): ``world_size`` ranks, ``seed``, ``epochs``, ``num_steps`` (global steps over all
epochs, equal on every rank), ``steps_per_epoch``, ``interleave`` (random | ascending), ``inputs``
(manifest file name, content hash, row count; buckets file name and SHA-256), ``buckets``,
``allocation``, ``per_epoch``, ``per_bucket``, ``padding`` (ratios and seconds / tokens),
``fallbacks``, ``shards`` (file name and SHA-256 per rank), ``plan_hash`` (SHA-256 of the rest,
keys sorted). Optional (absent from plans made with ``--balance 0`` and not re-planned):
``balance`` (:class:`BalanceInfo`) and ``replan`` (:class:`ReplanInfo`: the parent's hash and
world size, ``at_step`` from which this plan's shards hold the batches).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from manifests.buckets_file import BucketSpec, parse_buckets
from manifests.errors import ManifestError
from manifests.validation import Validator, load_json_file

PLAN_VERSION = 1
PLAN_JSON = "plan.json"
INTERLEAVES = ("random", "ascending")


@dataclass(frozen=True)
class ManifestRef:
    """The compiled manifest a plan indexes: file name, content hash, rows."""

    file: str
    content_hash: str
    rows: int


@dataclass(frozen=True)
class FileRef:
    """A file by name and the SHA-256 of its bytes; for a plan shard also its size (bytes) and
    the SHA-256 of its Parquet footer (the last ``footer length + 8`` bytes), checked on open."""

    file: str
    sha256: str
    size: int | None = None
    footer_sha256: str | None = None


@dataclass(frozen=True)
class StepsReport:
    """How full and how balanced a plan's steps are (:func:`bucketing.step_figures.plan_report`).

    ``steps``; ``fill``: Σ batch size ÷ Σ the batches' buckets' batch sizes (0..1);
    ``mean_batch`` utterances; ``straggler``: mean over steps of max ÷ mean predicted rank time
    − 1; ``idle``: share of rank time spent waiting for the slowest rank; ``same_bucket``: share
    of steps with one bucket on all ranks; ``balance_mean``: mean over steps of max ÷ mean padded
    audio seconds (batch size × longest duration); ``balance_over_1_10``: share of steps above 1.10.
    """

    steps: int
    fill: float
    mean_batch: float
    straggler: float
    idle: float
    same_bucket: float
    balance_mean: float
    balance_over_1_10: float

    def to_json(self) -> dict[str, Any]:
        return {k: (round(x, 6) if isinstance(x, float) else x) for k, x in asdict(self).items()}


@dataclass(frozen=True)
class BalanceInfo(StepsReport):
    """:class:`StepsReport` over all of a plan's epochs (step-weighted; ``steps`` summed), plus
    ``tolerance`` (the ``--balance`` asked for, 0 = one bucket per step), ``split_batches``
    (formed batches cut into pieces: the only short batches) and ``unbalanced_steps`` (steps
    whose predicted max ÷ mean time exceeds ``1 + tolerance``: counted fallbacks)."""

    tolerance: float
    split_batches: int
    unbalanced_steps: int

    @classmethod
    def from_json(cls, obj: Any, v: Validator) -> BalanceInfo:
        obj = v.obj(obj, "balance")
        vals: dict[str, Any] = {}
        for f in fields(cls):
            x = v.key(obj, f.name, "balance.")
            vals[f.name] = (v.int_(x, f"balance.{f.name}", lo=0) if f.type == "int"
                            else v.float_(x, f"balance.{f.name}", lo=0.0))
        for name in ("fill", "same_bucket", "balance_over_1_10", "idle"):
            if vals[name] > 1:
                raise v.fail(f"balance.{name}", f"a share must be <= 1, got {vals[name]}")
        return cls(**vals)


@dataclass(frozen=True)
class ReplanInfo:
    """Where a re-planned plan descends from: the parent's ``plan_hash`` and world size, and
    ``at_step`` (global): the parent's batches of steps < ``at_step`` were consumed; this plan's
    shards hold steps ``at_step`` .. ``num_steps - 1``."""

    parent_plan_hash: str
    parent_world_size: int
    at_step: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any, v: Validator) -> ReplanInfo:
        obj = v.obj(obj, "replan")
        return cls(parent_plan_hash=v.hex_(v.key(obj, "parent_plan_hash", "replan."), "replan.parent_plan_hash"),
                   parent_world_size=v.int_(v.key(obj, "parent_world_size", "replan."), "replan.parent_world_size",
                                            lo=1),
                   at_step=v.int_(v.key(obj, "at_step", "replan."), "replan.at_step", lo=0))


@dataclass(frozen=True)
class PlanMeta:
    """The typed content of ``plan.json`` (see the module docstring)."""

    manifest: ManifestRef
    buckets_file: FileRef
    buckets: list[dict[str, Any]]
    world_size: int
    seed: int
    epochs: int
    interleave: str
    allocation: dict[str, Any]
    num_steps: int
    steps_per_epoch: list[int]
    per_epoch: list[dict[str, Any]]
    per_bucket: list[dict[str, Any]]
    padding: dict[str, Any]
    fallbacks: dict[str, Any]
    shards: list[FileRef] = field(default_factory=list)
    plan_hash: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # keys added by newer writers, kept as read
    balance: BalanceInfo | None = None  # written when tolerance > 0 (see the module docstring)
    replan: ReplanInfo | None = None
    sync_group: int | None = None  # ranks per sync group when < world_size (written only then)
    source: str = field(default=PLAN_JSON, compare=False)  # the file it was read from, for errors

    @property
    def bucket_spec(self) -> BucketSpec:
        """``buckets`` as the typed :class:`BucketSpec` (validated as ``buckets.json`` is)."""
        return parse_buckets({"buckets": self.buckets}, self.source)

    @property
    def batch_sizes(self) -> npt.NDArray[np.int64]:
        """Utterances per batch of each bucket (int64, each >= 1; :meth:`BucketSpec.batch_sizes`)."""
        return self.bucket_spec.batch_sizes()

    @property
    def first_step(self) -> int:
        """The first global step this plan's shards hold (0, or ``replan.at_step``)."""
        return self.replan.at_step if self.replan is not None else 0

    def to_json(self) -> dict[str, Any]:
        """The dict written to ``plan.json`` (without ``shards`` / ``plan_hash`` / ``version``
        until :class:`~manifests.plan_files.PlanWriter` adds them)."""
        body: dict[str, Any] = {
            "inputs": {
                "manifest": {"file": self.manifest.file, "content_hash": self.manifest.content_hash,
                             "rows": self.manifest.rows},
                "buckets": {"file": self.buckets_file.file, "sha256": self.buckets_file.sha256},
            },
            "buckets": self.buckets,
            "world_size": self.world_size,
            "seed": self.seed,
            "epochs": self.epochs,
            "interleave": self.interleave,
            "allocation": self.allocation,
            "num_steps": self.num_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "per_epoch": self.per_epoch,
            "per_bucket": self.per_bucket,
            "padding": self.padding,
            "fallbacks": self.fallbacks,
            **self.extra,
        }
        if self.balance is not None and self.balance.tolerance > 0:
            body["balance"] = self.balance.to_json()
        if self.replan is not None:
            body["replan"] = self.replan.to_json()
        if self.sync_group is not None and self.sync_group != self.world_size:
            body["sync_group"] = self.sync_group
        if self.shards:
            body["shards"] = [{"file": s.file, "sha256": s.sha256, "size": s.size, "footer_sha256": s.footer_sha256}
                              for s in self.shards]
            body["version"] = PLAN_VERSION
        if self.plan_hash:
            body["plan_hash"] = self.plan_hash
        return body

    @property
    def first_step_of_epoch(self) -> list[int]:
        """Global step at which each epoch starts."""
        starts, s = [], 0
        for n in self.steps_per_epoch:
            starts.append(s)
            s += n
        return starts

    @classmethod
    def from_json(cls, obj: Any, where: str = PLAN_JSON) -> PlanMeta:
        """Validate every field; :class:`ManifestError` names the file and the field."""
        v = _PlanValidator(where)
        obj = v.obj(obj, "plan")
        version = obj.get("version")
        if version != PLAN_VERSION:
            raise ManifestError(f"{where}: unsupported plan version {version!r} (this tool reads {PLAN_VERSION})")
        inputs = v.obj(v.key(obj, "inputs"), "inputs")
        man = v.obj(v.key(inputs, "manifest", "inputs."), "inputs.manifest")
        bfile = v.obj(v.key(inputs, "buckets", "inputs."), "inputs.buckets")
        world_size = v.int_(v.key(obj, "world_size"), "world_size", lo=1)
        epochs = v.int_(v.key(obj, "epochs"), "epochs", lo=1)
        steps_per_epoch = [v.int_(x, f"steps_per_epoch[{i}]", lo=0)
                           for i, x in enumerate(v.list_(v.key(obj, "steps_per_epoch"), "steps_per_epoch"))]
        num_steps = v.int_(v.key(obj, "num_steps"), "num_steps", lo=0)
        if len(steps_per_epoch) != epochs or sum(steps_per_epoch) != num_steps:
            raise ManifestError(f"{where}: steps_per_epoch: {len(steps_per_epoch)} epochs summing to "
                                f"{sum(steps_per_epoch)} steps, but epochs = {epochs} and num_steps = {num_steps}")
        interleave = v.str_(v.key(obj, "interleave"), "interleave")
        if interleave not in INTERLEAVES:
            raise ManifestError(f"{where}: interleave: {interleave!r} is not one of {', '.join(INTERLEAVES)}")
        shards = [v.file_ref(s, f"shards[{i}]", shard=True)
                  for i, s in enumerate(v.list_(v.key(obj, "shards"), "shards"))]
        if len(shards) != world_size:
            raise ManifestError(f"{where}: shards: {len(shards)} listed for world size {world_size}")
        known = {"inputs", "buckets", "world_size", "seed", "epochs", "interleave", "allocation", "num_steps",
                 "steps_per_epoch", "per_epoch", "per_bucket", "padding", "fallbacks", "shards", "plan_hash",
                 "version", "balance", "replan", "sync_group"}
        sync_group = v.int_(obj["sync_group"], "sync_group", lo=1) if "sync_group" in obj else None
        if sync_group is not None and world_size % sync_group:
            raise ManifestError(f"{where}: sync_group: {sync_group} does not divide the world size {world_size}")
        replan = ReplanInfo.from_json(obj["replan"], v) if "replan" in obj else None
        if replan is not None and replan.at_step > num_steps:
            raise ManifestError(f"{where}: replan.at_step: {replan.at_step} is past the plan's {num_steps} steps")
        buckets = [v.obj(b, f"buckets[{i}]") for i, b in enumerate(v.list_(v.key(obj, "buckets"), "buckets"))]
        for b in parse_buckets({"buckets": buckets}, where).buckets:  # a plan was made with every batch size
            if b.batch_size is None:
                raise v.fail(f"buckets[{b.index}].batch_size", "missing (every bucket of a plan has one)")
        return cls(
            manifest=ManifestRef(file=v.str_(v.key(man, "file", "inputs.manifest."), "inputs.manifest.file"),
                                 content_hash=v.hex_(v.key(man, "content_hash", "inputs.manifest."),
                                                     "inputs.manifest.content_hash"),
                                 rows=v.int_(v.key(man, "rows", "inputs.manifest."), "inputs.manifest.rows", lo=0)),
            buckets_file=v.file_ref(bfile, "inputs.buckets"),
            buckets=buckets,
            world_size=world_size,
            seed=v.int_(v.key(obj, "seed"), "seed"),
            epochs=epochs,
            interleave=interleave,
            allocation=v.obj(v.key(obj, "allocation"), "allocation"),
            num_steps=num_steps,
            steps_per_epoch=steps_per_epoch,
            per_epoch=[v.obj(p, f"per_epoch[{i}]") for i, p in enumerate(v.list_(v.key(obj, "per_epoch"), "per_epoch"))],
            per_bucket=[v.obj(p, f"per_bucket[{i}]") for i, p in enumerate(v.list_(v.key(obj, "per_bucket"), "per_bucket"))],
            padding=v.obj(v.key(obj, "padding"), "padding"),
            fallbacks=v.obj(v.key(obj, "fallbacks"), "fallbacks"),
            shards=shards,
            plan_hash=v.hex_(v.key(obj, "plan_hash"), "plan_hash"),
            extra={k: val for k, val in obj.items() if k not in known},
            balance=BalanceInfo.from_json(obj["balance"], v) if "balance" in obj else None,
            replan=replan,
            sync_group=sync_group,
            source=where,
        )


class _PlanValidator(Validator):
    """:class:`Validator` plus the plan's file references."""

    def file_ref(self, x: Any, name: str, shard: bool = False) -> FileRef:
        x = self.obj(x, name)
        f = self.str_(self.key(x, "file", name + "."), name + ".file")
        if "/" in f or "\\" in f or f in (".", ".."):
            raise self.fail(name + ".file", f"must be a bare file name, got {f!r}")
        sha = self.hex_(self.key(x, "sha256", name + "."), name + ".sha256")
        if not shard:
            return FileRef(file=f, sha256=sha)
        if "size" not in x and "footer_sha256" not in x:
            raise self.fail(name, "records no size and footer hash: the plan was written by an older "
                                  "speech-dataprep; plan it again with `dataprep plan-batches`")
        return FileRef(file=f, sha256=sha, size=self.int_(self.key(x, "size", name + "."), name + ".size", lo=12),
                       footer_sha256=self.hex_(self.key(x, "footer_sha256", name + "."), name + ".footer_sha256"))


def plan_hash_of(body: dict[str, Any]) -> str:
    """``plan_hash``: SHA-256 of ``plan.json``'s fields but ``plan_hash`` itself (keys sorted)."""
    rest = {k: v for k, v in body.items() if k != "plan_hash"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def read_plan_meta(plan_dir: str | os.PathLike[str]) -> PlanMeta:
    """``plan.json`` of a plan directory, validated field by field and against its ``plan_hash``
    (recomputed from the fields read: an edited ``plan.json`` is refused by every reader);
    :class:`ManifestError` if it is not a plan."""
    path = Path(plan_dir) / PLAN_JSON
    obj = load_json_file(path, missing="no such file (not a plan directory; run `dataprep plan-batches`)")
    meta = PlanMeta.from_json(obj, str(path))
    if plan_hash_of(obj) != meta.plan_hash:
        raise ManifestError(f"{path}: plan_hash: differs from the hash of the file's content (plan.json edited?)")
    return meta
