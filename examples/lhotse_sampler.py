"""Lhotse: PlanSampler yields each step's CutSet; any Lhotse dataset turns it into a batch.

    python examples/lhotse_sampler.py PLAN_DIR MANIFEST [RANK]
"""
import json
import sys

from lhotse.dataset import IterableDatasetWrapper, UnsupervisedWaveformDataset
from torch.utils.data import DataLoader

from dataprep.integrations.lhotse import PlanDataLoader, PlanSampler, wrapper_warning_filter
from manifests.plan_meta import read_plan_meta

plan_dir, manifest = sys.argv[1], sys.argv[2]
rank = int(sys.argv[3]) if len(sys.argv) > 3 else 0
world_size = read_plan_meta(plan_dir).world_size
# channel=0: mono cuts from multi-channel audio too (default: a MultiCut holding every channel)
sampler = PlanSampler(plan_dir, manifest, rank=rank, world_size=world_size, channel=0)
dataset = UnsupervisedWaveformDataset()  # or K2SpeechRecognitionDataset(), your own CutSet -> batch
# sampler in the main process; state_dict() resumes at exactly the next batch
loader = PlanDataLoader(dataset, sampler, num_workers=2)
for batch in loader:
    print(json.dumps([c.id for c in batch["cuts"]]))  # your training step here
# or the sampler inside the workers (as NeMo does for tarred data): same batches, same order
wrapper_warning_filter()
loader = DataLoader(IterableDatasetWrapper(dataset, sampler), batch_size=None, num_workers=2)
for batch in loader:
    print(json.dumps([c.id for c in batch["cuts"]]))
