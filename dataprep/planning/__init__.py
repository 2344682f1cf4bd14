"""The planning stage: manifest + buckets.json -> plan directory (:func:`build_plan`), and the
tail-worker simulation of a written plan (:func:`simulate_plan`), and the elastic re-plan of a
plan at a step for another world size (:func:`replan`).

I/O around the pure core in :mod:`bucketing.plan` and :mod:`bucketing.simulate`; the
``plan-batches`` and ``simulate`` commands call these.
"""

from dataprep.planning.build import batch_sizes_of, build_plan, spills_to_disk
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import default_manifest, replan
from dataprep.planning.simulate import (
    DEFAULT_WORLD_SIZES,
    read_epoch_batches,
    simulate_plan,
)

__all__ = ["DEFAULT_WORLD_SIZES", "PlanOptions", "batch_sizes_of", "build_plan", "default_manifest",
           "read_epoch_batches", "replan", "simulate_plan", "spills_to_disk"]
