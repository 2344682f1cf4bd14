"""Plain PyTorch: a map-style dataset over the compiled manifest, batches and resume from the plan.

    python examples/pytorch_sampler.py PLAN_DIR MANIFEST [RANK]
"""
import json
import sys

import pyarrow.parquet as pq
import soundfile
import torch
from torch.utils.data import DataLoader, Dataset

from dataprep.integrations.torch import PlanBatchSampler


class Utterances(Dataset):
    """Row i of the compiled manifest -> (id, mono audio); the plan's batches are row numbers."""

    def __init__(self, manifest):
        self.rows = pq.read_table(manifest, columns=["id", "audio_path", "offset", "duration"]).to_pylist()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        with soundfile.SoundFile(r["audio_path"]) as f:
            f.seek(round(r["offset"] * f.samplerate))
            audio = f.read(round(r["duration"] * f.samplerate), dtype="float32", always_2d=True)
        return r["id"], torch.from_numpy(audio.mean(axis=1))


def collate(items):
    ids, audio = zip(*items)
    return list(ids), torch.nn.utils.rnn.pad_sequence(audio, batch_first=True)


plan_dir, manifest = sys.argv[1], sys.argv[2]
rank = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # torch.distributed.get_rank() under DDP
sampler = PlanBatchSampler(plan_dir, rank)
loader = DataLoader(Utterances(manifest), batch_sampler=sampler, collate_fn=collate)
for ids, audio in loader:
    print(json.dumps(ids))  # your training step here
    if len(sampler) == 2:  # e.g. checkpoint: sampler.state_dict() holds the next step
        checkpoint = {"sampler": sampler.state_dict()}
        break
resumed = PlanBatchSampler(plan_dir, rank)
resumed.load_state_dict(checkpoint["sampler"])  # continues at exactly the next batch
for ids, audio in DataLoader(Utterances(manifest), batch_sampler=resumed, collate_fn=collate):
    print(json.dumps(ids))
