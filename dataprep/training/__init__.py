"""The training stage: a torch loader over a plan and a thin DDP loop that consumes it.

- :mod:`manifests.column_cache`: the memory-mapped manifest column cache (torch-free; re-exported here)
- :mod:`~dataprep.training.audio`: one utterance's audio segment, mono 16 kHz
- :mod:`~dataprep.training.features`: log-mel features in pure torch
- :mod:`~dataprep.training.dynres`: dynamic-resolution features and the collate helper
- :mod:`~dataprep.training.batches`: plan batch -> padded tensor :class:`Batch`
- :mod:`~dataprep.training.packing` / :mod:`~dataprep.training.packed`: packed batches (speech-LLMs)
- :mod:`~dataprep.training.loader`: :class:`PlanDataset`, prefetch, :func:`make_loader`
- :mod:`~dataprep.training.loop`: :class:`TrainConfig`, :func:`train`, :func:`run_rank`, checkpoints

``torchrun --nproc-per-node N -m dataprep.cli train PLAN --manifest ...`` runs one rank per
process. Importing this package imports torch; :class:`TrainConfig` lives in the torch-free
:mod:`dataprep.training_config`.
"""

from dataprep.training.audio import AudioError, load_audio
from dataprep.training.batches import Batch, BatchBuilder, pad_stack
from manifests.column_cache import (
    LOADER_COLUMNS,
    ColumnCache,
    RowsMeta,
    build_column_cache,
    default_cache_dir,
)
from dataprep.training.dynres import DynResFeatures, collate_dynamic_resolution, time_mask_widths
from dataprep.training.features import HOP, SAMPLE_RATE, LogMel, mel_filterbank
from dataprep.training.loader import PlanDataset, make_loader, prefetch
from dataprep.training.packed import PackedBatch, PackedBatchBuilder, PackedCuts, collate_packed
from dataprep.training.packing import PackLayout, pack_layout
from dataprep.training.loop import batch_digest, check_plan, run_rank, train
from dataprep.training_config import TrainConfig

__all__ = [
    "HOP",
    "LOADER_COLUMNS",
    "SAMPLE_RATE",
    "AudioError",
    "Batch",
    "BatchBuilder",
    "ColumnCache",
    "DynResFeatures",
    "LogMel",
    "PackLayout",
    "PackedBatch",
    "PackedBatchBuilder",
    "PackedCuts",
    "PlanDataset",
    "RowsMeta",
    "TrainConfig",
    "batch_digest",
    "build_column_cache",
    "check_plan",
    "collate_packed",
    "collate_dynamic_resolution",
    "default_cache_dir",
    "load_audio",
    "make_loader",
    "mel_filterbank",
    "pack_layout",
    "pad_stack",
    "prefetch",
    "run_rank",
    "time_mask_widths",
    "train",
]
