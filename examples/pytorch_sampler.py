"""Plain PyTorch: a map-style dataset over the compiled manifest, batches and resume from the plan.

    python examples/pytorch_sampler.py PLAN_DIR MANIFEST [RANK]
"""
import sys

import pyarrow.parquet as pq
import soundfile

try:
    import torch
    from torch.utils.data import DataLoader, Dataset
except ModuleNotFoundError:
    sys.exit("this example needs torch: pip install torch==2.13.0 (the CPU build), then pip install -e '.[torch]'")

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
    lengths = torch.tensor([len(a) for a in audio])
    return list(ids), torch.nn.utils.rnn.pad_sequence(audio, batch_first=True), lengths


def describe(step, ids, audio, lengths):
    padding = 1 - lengths.sum().item() / audio.numel()
    return f"step {step}: {len(ids)} utterances, padded to {audio.shape[1]:,} samples ({padding:.0%} padding)"


plan_dir, manifest = sys.argv[1], sys.argv[2]
rank = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # torch.distributed.get_rank() under DDP
sampler = PlanBatchSampler(plan_dir, rank)
print(f"rank {rank}: {len(sampler)} batches in the plan")
loader = DataLoader(Utterances(manifest), batch_sampler=sampler, collate_fn=collate)
for step, (ids, audio, lengths) in enumerate(loader):
    print(describe(step, ids, audio, lengths))  # your training step here
    if step == 2:  # e.g. checkpoint: sampler.state_dict() holds the next step
        checkpoint = {"sampler": sampler.state_dict()}
        break
resumed = PlanBatchSampler(plan_dir, rank)
resumed.load_state_dict(checkpoint["sampler"])  # continues at exactly the next batch
first, batches, utterances = resumed.next_step, 0, 0
for ids, audio, lengths in DataLoader(Utterances(manifest), batch_sampler=resumed, collate_fn=collate):
    batches, utterances = batches + 1, utterances + len(ids)
print(f"resumed at step {first}: {batches} more batches, {utterances:,} utterances, to the end of the plan")
