"""One rank of a 2-rank Lightning DDP run (gloo, CPU) over ``get_plan_dataloader``, launched
from outside as torchrun would (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``LOCAL_RANK``).

    python -m tests.integrations._lightning_plan PLAN MANIFEST WORKDIR STEP

For the map-style and the iterable loader (``force_iterable_dataset``) in turn: a run with
NeMo's ``max_epochs: -1`` and no ``max_steps``, saving Lightning checkpoints every ``STEP``
steps (``ModelCheckpoint``, and ``last.ckpt``) until the plan's end; a run resumed from the
checkpoint at ``STEP`` (``fit(ckpt_path=...)``); a run resumed from ``last.ckpt``. Prints a JSON
line per training step (``{"mode", "run", "rank", "step", "ids"}``) and one per returned
``fit()``. Test helper of ``tests/integrations/test_nemo_resume.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from dataprep.integrations.nemo import get_plan_dataloader


class CutIdsAndAudio(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A batch: the cuts' ids and their audio read (Lhotse's ``collate_audio``)."""

    def __getitem__(self, cuts):
        from lhotse.dataset.collation import collate_audio

        audio, lens = collate_audio(cuts)
        return {"ids": [c.id for c in cuts], "audio": audio, "lens": lens}


class Tiny(pl.LightningModule):
    def __init__(self, config: dict, tag: dict) -> None:
        super().__init__()
        self.config, self.tag = config, tag
        self.lin = torch.nn.Linear(1, 1)

    def train_dataloader(self):
        return get_plan_dataloader(self.config, self.global_rank, self.trainer.world_size, CutIdsAndAudio())

    def training_step(self, batch, batch_idx):
        print(json.dumps({**self.tag, "rank": self.global_rank, "step": self.trainer.global_step,
                          "ids": batch["ids"]}), flush=True)
        return self.lin(batch["lens"].float()[:, None] / 16000).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(config: dict, tag: dict, ckpt_dir: Path, every: int, ckpt_path: str | None) -> None:
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, save_top_k=-1, save_last=True,
                                 filename="{step}")]
    trainer = pl.Trainer(max_epochs=-1, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(config, tag), ckpt_path=ckpt_path)
    print(json.dumps({**tag, "rank": trainer.global_rank, "fit_returned": trainer.global_step}), flush=True)


def main(plan: str, manifest: str, work: str, every: int) -> None:
    for mode in ("map", "iterable"):
        config = {"use_lhotse": True, "plan_dir": plan, "manifest": manifest, "sample_rate": 16000,
                  "channel_selector": 0, "num_workers": 1, "force_iterable_dataset": mode == "iterable"}
        ckpts = Path(work) / mode
        fit(config, {"mode": mode, "run": "fresh"}, ckpts, every, None)
        fit(config, {"mode": mode, "run": "resumed"}, ckpts / "again", every, str(ckpts / f"step={every}.ckpt"))
        fit(config, {"mode": mode, "run": "at-end"}, ckpts / "end", every, str(ckpts / "last.ckpt"))


if __name__ == "__main__":
    main(*sys.argv[1:4], int(sys.argv[4]))
