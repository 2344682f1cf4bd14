"""Equal-occupancy bucket fitting (1D/2D), allocation, batch forming, the batch planner and
the simulators (padding, step-time cost, tail worker). Pure functions over arrays and
frames: no paths, no torch, nothing of ``dataprep/`` or ``oom/``."""

# the public modules (imported on use: this package's __init__ loads nothing)
__all__ = [
    "allocate",
    "balance",
    "batching",
    "bucket_order",
    "budget",
    "costmodel",
    "dynres",
    "fit",
    "fit_passes",
    "groups",
    "held_columns",
    "padding",
    "plan",
    "plan_summary",
    "quota",
    "simulate",
    "step_figures",
    "steps_report",
]
