"""Hugging Face datasets: the compiled manifest as a ``datasets.Dataset``, batches from the plan.

    python examples/hf_datasets.py PLAN_DIR MANIFEST [RANK]
"""
import json
import sys

import datasets
from torch.utils.data import DataLoader

from dataprep.integrations.torch import PlanBatchSampler

plan_dir, manifest = sys.argv[1], sys.argv[2]
rank = int(sys.argv[3]) if len(sys.argv) > 3 else 0
corpus = datasets.Dataset.from_parquet(manifest)  # row i = manifest row i, the plan's row numbers
# corpus = corpus.cast_column("audio_path", datasets.Audio())  # decode audio with datasets' own Audio feature
loader = DataLoader(corpus, batch_sampler=PlanBatchSampler(plan_dir, rank),
                    collate_fn=lambda rows: [r["id"] for r in rows])
for ids in loader:
    print(json.dumps(ids))  # your training step here
