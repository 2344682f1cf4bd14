""":class:`PlanOptions`: everything ``build_plan`` (and ``replan``) is asked to do besides
which files to read and write, checked once, here, whatever the caller (CLI or Python)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bucketing.balance import DEFAULT_BALANCE
from bucketing.costmodel import CostModel
from bucketing.dynres import DynResConfig
from bucketing.packing import DEFAULT_AUDIO_TOKEN_RATE
from bucketing.speeds import RankSpeeds
from manifests.errors import DataprepError, OptionError
from manifests.options import MAX_COUNT, check_bool, check_choice, check_int, check_number, check_str

INTERLEAVES = ("random", "ascending")
#: Default ``weight_tolerance``: a corpus's share of every window within 5 points of its target
DEFAULT_WEIGHT_TOLERANCE = 0.05


def check_stages(stages: object, epochs: int) -> None:
    """``stages``: (epochs >= 1, weights) pairs whose epochs sum to the plan's, each weighing
    the same corpora."""
    if not isinstance(stages, (tuple, list)) or not stages:
        raise OptionError("stages", f"must be (epochs, weights) pairs, got {stages!r}")
    names = None
    for st in stages:
        if not isinstance(st, (tuple, list)) or len(st) != 2 or not isinstance(st[1], Mapping) or not st[1]:
            raise OptionError("stages", f"must be (epochs, weights) pairs, got {st!r}")
        if isinstance(st[0], bool) or not isinstance(st[0], int) or st[0] < 1:
            raise OptionError("stages", f"a stage's epochs must be an integer >= 1, got {st[0]!r}")
        if names is not None and set(st[1]) != names:
            raise OptionError("stages", f"every stage must weigh the same corpora ({', '.join(sorted(names))})")
        names = set(st[1])
    total = sum(st[0] for st in stages)
    if total != epochs:
        raise OptionError("stages", f"the stages' epochs ({total}) must be the plan's epochs ({epochs})")


def check_rank_speed(speeds: object, world_size: int) -> None:
    """``speeds``: one finite number > 0 per rank."""
    if not isinstance(speeds, (tuple, list)):
        raise OptionError("rank_speed", f"must be a list of numbers, one per rank, got {speeds!r}")
    if len(speeds) != world_size:
        raise OptionError("rank_speed", f"must give one speed per rank ({world_size}), got {len(speeds)}")
    for s in speeds:
        check_number("rank_speed", s, gt=0)


@dataclass(frozen=True)
class PlanOptions:
    """How to plan.

    ``world_size``: ranks (1..2**20). ``seed``: with the epoch number it fixes every order
    (0..2**63-1). ``epochs``: epochs to plan (>= 1). ``strict``: drop rows over their bin's
    tokens. ``interleave``: step order across buckets, ``random`` or ``ascending``.
    ``row_group_steps``: steps per Parquet row group (>= 1). ``carry``: a bucket's leftover rows
    fill the next bucket. ``balance``: relative tolerance of balanced steps (>= 0; 0 = one
    bucket per step). ``cost``: the step-time model for ``balance`` (None: defaults).
    ``cost_equal``: batch sizes re-derived for the same predicted step time under ``cost``, the
    buckets' sizes as memory caps (:func:`bucketing.budget.cost_equal_spec`).
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
    ``rank_speed``: each rank's relative speed (finite, > 0; one per rank; None or all equal:
    every rank alike), for balanced steps only (:mod:`bucketing.speeds`).
    ``weight_window``: a weighted plan's steps ordered so every that many consecutive steps hold
    each corpus within ``weight_tolerance`` (absolute share, (0, 1]) of its share of the epoch
    (:func:`bucketing.quota.window_order`; balanced steps, random interleave, no sync groups).
    ``stages``: (epochs, weights) per stage (:mod:`dataprep.planning.stages`; replaces
    ``weights``; the stages' epochs are the plan's).
    ``pack``: packed sequences of at most this many token-equivalents (>= 1; None: batches of
    utterances), a row's te = ceil(duration x ``audio_token_rate``) + num_tokens (> 0, audio
    tokens per second); ``sequences_per_batch`` (>= 1; None: per bucket, its batch size over
    the most utterances of audio a sequence of it holds) (:mod:`dataprep.planning.packed`).
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
    cost_equal: bool = False
    sync_group: int | None = None
    dynamic_resolution: DynResConfig | None = None
    weights: Mapping[str, float] | None = None
    temperature: float | None = None
    epoch_utterances: int | None = None
    epoch_hours: float | None = None
    memory_limit: int | None = None
    rank_speed: tuple[float, ...] | None = None
    weight_window: int | None = None
    weight_tolerance: float = DEFAULT_WEIGHT_TOLERANCE
    stages: tuple[tuple[int, Mapping[str, float]], ...] | None = None
    container_block: int | None = None
    pack: int | None = None
    audio_token_rate: float = DEFAULT_AUDIO_TOKEN_RATE
    sequences_per_batch: int | None = None

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
        check_bool("cost_equal", self.cost_equal)
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
        if self.rank_speed is not None:
            check_rank_speed(self.rank_speed, self.world_size)
            if self.balance == 0 and len(set(self.rank_speed)) > 1:
                raise OptionError("rank_speed", "needs balanced steps (--balance > 0): one bucket per step "
                                                "gives every rank the same batch")
        if self.stages is not None:
            check_stages(self.stages, self.epochs)
            if self.weights is not None:
                raise OptionError("stages", "each stage gives its weights: give --stage or --weights, not both")
            for _, weights in self.stages:
                for name, w in weights.items():
                    check_str("stages", name)
                    check_number("stages", w, gt=0)
        check_int("weight_window", self.weight_window, ge=1, optional=True)
        check_number("weight_tolerance", self.weight_tolerance, gt=0, le=1)
        if self.weight_window is not None:
            if self.balance == 0:
                raise OptionError("weight_window", "needs balanced steps (--balance > 0)")
            if self.interleave != "random":
                raise OptionError("weight_window", "orders the steps itself: use --interleave random")
            if self.sync_group is not None and self.sync_group != self.world_size:
                raise OptionError("weight_window", "sync groups draw the steps in their own orders; "
                                                   "give no --sync-group")
        check_int("container_block", self.container_block, ge=1, optional=True)
        self._check_pack()

    def _check_pack(self) -> None:
        check_int("pack", self.pack, ge=1, le=2**31 - 1, optional=True)
        check_number("audio_token_rate", self.audio_token_rate, gt=0, le=1e6)
        check_int("sequences_per_batch", self.sequences_per_batch, ge=1, optional=True)
        if self.pack is None:
            for name in ("sequences_per_batch", "audio_token_rate"):
                if getattr(self, name) != getattr(PlanOptions, name):
                    raise OptionError(name, "sizes packed sequences: give --pack N too")
            return
        for name in ("dynamic_resolution", "weights", "temperature", "epoch_utterances", "epoch_hours", "stages",
                     "container_block", "weight_window", "rank_speed"):
            if getattr(self, name) is not None:
                raise OptionError(name, "is not available with --pack (packed plans weigh no corpora and "
                                        "record no target frames, container blocks or rank speeds)")
        if self.cost_equal:
            raise OptionError("cost_equal", "is not available with --pack: packed batches are sized by "
                                            "--sequences-per-batch or the buckets' batch sizes")

    @property
    def speeds(self) -> RankSpeeds | None:
        """The ranks' speed classes (None: every rank alike)."""
        return None if self.rank_speed is None else RankSpeeds.of(self.rank_speed)

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


def parse_rank_speed(value: str) -> tuple[float, ...]:
    """``--rank-speed``: speeds as ``1,1,0.7,...`` (one per rank, relative: 0.5 takes twice as
    long), or a file: a ``costmodel.json`` of ``dataprep calibrate`` (its ``rank_speed`` are
    time factors, 1.2 = 20% slower: the speed is their inverse; a rank the log lacks runs at
    1), or text of numbers separated by commas or lines. Bad input: a one-line error naming
    the file (and line)."""
    text = value.strip()
    if text and all(_is_number(p) for p in text.split(",")):
        return tuple(float(p) for p in text.split(","))
    path = Path(value)
    try:
        body = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataprepError(f"--rank-speed: {value}: neither speeds (1,1,0.7) nor a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataprepError(f"{path}: cannot read rank speeds ({exc})") from None
    if body.lstrip().startswith("{"):
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise DataprepError(f"{path}: not JSON ({exc})") from None
        factors = obj.get("rank_speed") if isinstance(obj, dict) else None
        if not isinstance(factors, list) or not factors:
            raise DataprepError(f"{path}: no rank_speed list (a costmodel.json of `dataprep calibrate`)")
        out = []
        for i, f in enumerate(factors):
            if f is None:
                out.append(1.0)
            elif isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
                raise DataprepError(f"{path}: rank_speed[{i}]: expected a number > 0, got {f!r}")
            else:
                out.append(1.0 / float(f))
        return tuple(out)
    speeds: list[float] = []
    for line_no, line in enumerate(body.splitlines(), 1):
        for part in (p.strip() for p in line.split("#")[0].split(",")):
            if not part:
                continue
            if not _is_number(part):
                raise DataprepError(f"{path}:{line_no}: not a speed: {part!r}")
            speeds.append(float(part))
    if not speeds:
        raise DataprepError(f"{path}: lists no speeds")
    return tuple(speeds)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def replan_speeds(options: PlanOptions, parent_speeds: object, parent_world: int,
                  tolerance: float) -> tuple[float, ...] | None:
    """A re-plan's rank speeds: ``options.rank_speed``, else the parent's (``plan.json``'s
    ``rank_speed``) where the world size stays; refused for a plan of one bucket per step."""
    speeds = options.rank_speed
    if speeds is None and isinstance(parent_speeds, list) and options.world_size == parent_world:
        speeds = tuple(float(s) for s in parent_speeds)
    if speeds is not None and tolerance == 0 and RankSpeeds.of(speeds) is not None:
        raise OptionError("rank_speed", "needs balanced steps; the plan has one bucket per step (--balance 0)")
    return speeds
