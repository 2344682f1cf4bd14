""":class:`PlanOptions`: everything ``build_plan`` (and ``replan``) is asked to do besides
which files to read and write, checked once, here, whatever the caller (CLI or Python)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bucketing.balance import DEFAULT_BALANCE
from bucketing.costmodel import CostModel
from bucketing.dynres import DynResConfig
from manifests.errors import OptionError
from manifests.options import MAX_COUNT, check_bool, check_choice, check_int, check_number, check_str

INTERLEAVES = ("random", "ascending")


@dataclass(frozen=True)
class PlanOptions:
    """How to plan.

    ``world_size``: ranks (1..2**20). ``seed``: with the epoch number it fixes every order
    (0..2**63-1). ``epochs``: epochs to plan (>= 1). ``strict``: drop rows over their bin's
    tokens. ``interleave``: step order across buckets, ``random`` or ``ascending``.
    ``row_group_steps``: steps per Parquet row group (>= 1). ``carry``: a bucket's leftover rows
    fill the next bucket. ``balance``: relative tolerance of balanced steps (>= 0; 0 = one
    bucket per step). ``cost``: the step-time model for ``balance`` (None: defaults).
    ``sync_group``: ranks synchronized together (divides ``world_size``; None = all).
    ``dynamic_resolution``: record per batch its target frames (None: off).
    Weighted plans (many corpora, :mod:`dataprep.planning.weights`): ``weights`` corpus ->
    weight (> 0; replaces the blend the manifest records), ``temperature`` (>= 0; replaces every
    level's), the epoch size ``epoch_utterances`` (>= 1) or about ``epoch_hours`` (> 0) of audio
    (default: the rows in a bucket).
    ``container_block``: order each bucket in shuffled blocks of this many containers
    (:mod:`dataprep.planning.container_blocks`; None: a full shuffle, grouped in windows).
    ``memory_limit``: bytes the planner may hold (>= 1; None: half the machine's memory); the
    spill (:mod:`dataprep.planning.spill`) is held in memory for a corpus within it and
    written to disk for a larger one, in memory bounded by its largest bucket.
    """

    world_size: int
    seed: int = 0
    epochs: int = 1
    strict: bool = False
    interleave: str = "random"
    row_group_steps: int = 128
    carry: bool = True
    balance: float = DEFAULT_BALANCE
    cost: CostModel | None = None
    sync_group: int | None = None
    dynamic_resolution: DynResConfig | None = None
    weights: Mapping[str, float] | None = None
    temperature: float | None = None
    epoch_utterances: int | None = None
    epoch_hours: float | None = None
    memory_limit: int | None = None
    container_block: int | None = None

    def __post_init__(self) -> None:
        check_int("world_size", self.world_size, ge=1)
        check_int("seed", self.seed, ge=0, le=2**63 - 1)
        check_int("epochs", self.epochs, ge=1)
        check_bool("strict", self.strict)
        check_choice("interleave", self.interleave, INTERLEAVES)
        check_int("row_group_steps", self.row_group_steps, ge=1)
        check_bool("carry", self.carry)
        check_number("balance", self.balance, ge=0)
        if self.cost is not None and not isinstance(self.cost, CostModel):
            raise OptionError("cost", f"must be a CostModel, got {type(self.cost).__name__}")
        check_int("sync_group", self.sync_group, ge=1, le=MAX_COUNT, optional=True)
        if self.sync_group is not None and self.world_size % self.sync_group:
            raise OptionError("sync_group", f"must divide the world size {self.world_size}, got {self.sync_group}")
        if self.weights is not None:
            if not isinstance(self.weights, Mapping) or not self.weights:
                raise OptionError("weights", f"must map each corpus to a weight, got {self.weights!r}")
            for name, w in self.weights.items():
                check_str("weights", name)
                check_number("weights", w, gt=0)
        check_number("temperature", self.temperature, ge=0, optional=True)
        check_int("epoch_utterances", self.epoch_utterances, ge=1, le=None, optional=True)
        check_number("epoch_hours", self.epoch_hours, gt=0, optional=True)
        if self.epoch_utterances is not None and self.epoch_hours is not None:
            raise OptionError("epoch_hours", "give --epoch-utterances or --epoch-hours, not both")
        if self.dynamic_resolution is not None and not isinstance(self.dynamic_resolution, DynResConfig):
            raise OptionError("dynamic_resolution", f"must be a DynResConfig, got {type(self.dynamic_resolution).__name__}")
        check_int("memory_limit", self.memory_limit, ge=1, le=2**62, optional=True)
        check_int("container_block", self.container_block, ge=1, optional=True)

    @property
    def group(self) -> int:
        """Ranks per synchronized group (``world_size`` when ``sync_group`` is None)."""
        return self.world_size if self.sync_group is None else self.sync_group

    def check_rows(self, rows: int) -> None:
        """Refuse a world size no step of a manifest of ``rows`` rows can fill (one batch per
        rank): called before anything is allocated per rank (shard files, per-rank arrays)."""
        if self.world_size > rows:
            raise OptionError("world_size", f"must be <= the number of rows ({rows}) of the manifest, "
                                            f"got {self.world_size}")
