"""Command: ``train`` (the thin DDP loop over a plan, :mod:`dataprep.training`).

:mod:`dataprep.training` (and torch) is imported inside the command, so the rest of the CLI
works without it; ``python -m dataprep.training`` (torchrun) reuses :func:`train_cmd`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dataprep.cli.app import app, check_range, out, user_errors
from manifests.errors import DataprepError
from manifests.outputs import refuse_same_paths

ManifestOpt = Annotated[Path, typer.Option("--manifest", "-m", help="The compiled manifest the buckets / plan were made from.")]


@app.command("train")
@user_errors
def train_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory written by plan-batches.")],
    manifest: ManifestOpt,
    tokenizer: Annotated[list[str], typer.Option(help="Sentencepiece model, or LANG=MODEL once per language.")],
    checkpoint_dir: Annotated[Path, typer.Option(help="Checkpoints, step log, skipped ids, traces.")],
    model: Annotated[str, typer.Option(help="oom.models name (tiny, small, canary-1b-flash, ...) or pkg.module:factory.")] = "tiny",
    steps: Annotated[Optional[int], typer.Option(help="Train up to this global plan step (default: the whole plan).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from <checkpoint-dir>/last.pt at its next step.")] = False,
    nproc: Annotated[int, typer.Option(help="Local processes to spawn (= the plan's world size). Ignored under torchrun.")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3,
    seed: Annotated[int, typer.Option(help="Seed for the model init and dropout.")] = 0,
    workers: Annotated[int, typer.Option(help="DataLoader worker processes per rank (0 = one prefetch thread).")] = 0,
    prefetch: Annotated[int, typer.Option(help="Batches prepared ahead.")] = 2,
    skip_bad_audio: Annotated[bool, typer.Option("--skip-bad-audio", help="Skip utterances whose audio fails, log them to skipped-rank-*.jsonl.")] = False,
    checkpoint_every: Annotated[int, typer.Option(help="Save every N steps (0 = only at the end).")] = 0,
    trace: Annotated[bool, typer.Option("--trace", help="Write trace-rank-*.jsonl: ids and tensor hash per step.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    timeout: Annotated[float, typer.Option(help="Seconds before a hung collective / rank is reported.")] = 600.0,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Where the memory-mapped manifest columns are cached.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No per-step lines on stdout.")] = False,
    dynamic_resolution: Annotated[bool, typer.Option("--dynamic-resolution/--no-dynamic-resolution", help="For a plan made with --dynamic-resolution: featurize each utterance at the rate that gives its batch's target frames (off: 10 ms hop, ordinary padding).")] = True,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --checkpoint-dir (refused without this or --resume).")] = False,
    allow_other_tokenizer: Annotated[bool, typer.Option("--allow-other-tokenizer", help="Train with a tokenizer other than the one the manifest was compiled with.")] = False,
) -> None:
    """Train a reference model on the plan with DDP (gloo on CPU, nccl on GPU); one JSON line per step."""
    from dataprep.training import TrainConfig, train

    if device not in ("auto", "cpu", "cuda"):
        raise DataprepError(f"--device: must be auto, cpu or cuda, got {device!r}")
    check_range("--steps", steps, ge=0)
    check_range("--nproc", nproc, ge=1)
    check_range("--lr", lr, gt=0)
    check_range("--workers", workers, ge=0)
    check_range("--prefetch", prefetch, ge=0)
    check_range("--checkpoint-every", checkpoint_every, ge=0)
    check_range("--timeout", timeout, gt=0)
    refuse_same_paths({"PLAN": plan_dir, "--manifest": manifest, **{f"--tokenizer {t}": t.partition("=")[2] or t
                                                                  for t in tokenizer}},
                      {"--checkpoint-dir": checkpoint_dir})
    cfg = TrainConfig(plan_dir=str(plan_dir), manifest=str(manifest), tokenizer=list(tokenizer),
                      checkpoint_dir=str(checkpoint_dir), model=model, steps=steps, resume=resume, lr=lr, seed=seed,
                      workers=workers, prefetch=prefetch, skip_bad_audio=skip_bad_audio,
                      checkpoint_every=checkpoint_every, trace=trace, device=device, timeout_s=timeout,
                      cache_dir=str(cache_dir) if cache_dir else None, quiet=quiet,
                      dynamic_resolution=dynamic_resolution, overwrite=overwrite,
                      allow_other_tokenizer=allow_other_tokenizer)
    summary = train(cfg, nproc=nproc)
    if summary.get("rank", 0) == 0:
        out.print(f"trained to step {summary['next_step']}; checkpoint -> {checkpoint_dir / 'last.pt'}")
