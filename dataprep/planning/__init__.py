"""The planning stage: manifest + buckets.json -> plan directory (:func:`build_plan`), and the
tail-worker simulation of a written plan (:func:`simulate_plan`), and the elastic re-plan of a
plan at a step for another world size (:func:`replan`).

The spill by bucket that plans use (:func:`spill_manifest`, :func:`carry_spilled`,
:func:`plan_epoch_figures`) is public for reports that need a plan's figures, not its shards.
I/O around the pure core in :mod:`bucketing.plan` and :mod:`bucketing.simulate`; the
``plan-batches`` and ``simulate`` commands call these.
"""

from dataprep.planning.build import build_plan, spills_to_disk
from dataprep.planning.options import PlanOptions
from dataprep.planning.carry import carry_spilled
from dataprep.planning.layout import plan_epoch_figures
from dataprep.planning.spill import SpilledCorpus, spill_manifest
from dataprep.planning.replan import default_manifest, replan
from dataprep.planning.simulate import (
    DEFAULT_WORLD_SIZES,
    plan_steps_report,
    read_epoch_batches,
    simulate_plan,
    simulate_strategies,
)
from dataprep.planning.weights import check_quotas, parse_weights

__all__ = ["DEFAULT_WORLD_SIZES", "PlanOptions", "build_plan", "default_manifest",
           "SpilledCorpus", "carry_spilled", "check_quotas", "parse_weights", "plan_epoch_figures", "plan_steps_report",
           "read_epoch_batches", "replan", "simulate_plan", "simulate_strategies", "spill_manifest", "spills_to_disk"]
