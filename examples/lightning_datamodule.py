"""PyTorch Lightning: a DataModule whose train loader replays this rank's plan shard.

    python examples/lightning_datamodule.py PLAN_DIR MANIFEST

``use_distributed_sampler=False``: the plan already gives each rank its own batches.
"""
import json
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader

from dataprep.integrations.torch import PlanBatchSampler


class PlanDataModule(L.LightningDataModule):
    def __init__(self, plan_dir, manifest):
        super().__init__()
        self.plan_dir, self.manifest = plan_dir, manifest

    def setup(self, stage):
        import pyarrow.parquet as pq

        self.rows = pq.read_table(self.manifest, columns=["id", "duration"]).to_pylist()

    def train_dataloader(self):
        sampler = PlanBatchSampler(self.plan_dir, rank=self.trainer.global_rank)
        return DataLoader(self.rows, batch_sampler=sampler, collate_fn=lambda rows: rows)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, rows, i):
        print(json.dumps([r["id"] for r in rows]))
        return ((self.w - torch.tensor([r["duration"] for r in rows])) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, use_distributed_sampler=False, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), datamodule=PlanDataModule(sys.argv[1], sys.argv[2]))
