"""Command: ``train`` (the thin DDP loop over a plan, :mod:`dataprep.training`).

Options and their defaults are :class:`dataprep.training_config.TrainConfig`'s (torch-free);
:mod:`dataprep.training` (and torch) is imported inside the command, so the rest of the CLI
works without it. Under torchrun: ``torchrun --nproc-per-node N -m dataprep.cli train ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dataprep.cli.app import app, build_options, defaults_of, option_flags, out, user_errors
from dataprep.training_config import TrainConfig
from manifests.optional import require
from oom.options import MODEL_NAMES
from oom.packed_estimate import SPEECH_LLMS
from manifests.outputs import refuse_same_paths

ManifestOpt = Annotated[Path, typer.Option("--manifest", "-m", help="The compiled manifest the buckets / plan were made from.")]
#: TrainConfig field -> flag where the flag is not ``--field-name``
TRAIN_FLAGS = {"timeout_s": "--timeout", "plan_dir": "PLAN"}
_D = defaults_of(TrainConfig)


@app.command("train")
@user_errors
def train_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory written by plan-batches.")],
    manifest: ManifestOpt,
    tokenizer: Annotated[list[str], typer.Option(help="Sentencepiece model, or LANG=MODEL once per language.")],
    checkpoint_dir: Annotated[Path, typer.Option(help="Checkpoints, step log, skipped ids, traces.")],
    model: Annotated[str, typer.Option(help=f"{', '.join(MODEL_NAMES)}, {', '.join(SPEECH_LLMS)} (packed batches), or pkg.module:factory.")] = _D.model,
    steps: Annotated[Optional[int], typer.Option(help="Train up to this global plan step (default: the whole plan).")] = _D.steps,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from <checkpoint-dir>/last.pt at its next step.")] = _D.resume,
    nproc: Annotated[int, typer.Option(help="Local processes to spawn (= the plan's world size). Ignored under torchrun.")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = _D.lr,
    seed: Annotated[int, typer.Option(help="Seed for the model init and dropout.")] = _D.seed,
    workers: Annotated[int, typer.Option(help="DataLoader worker processes per rank (0 = one prefetch thread).")] = _D.workers,
    prefetch: Annotated[int, typer.Option(help="Batches prepared ahead.")] = _D.prefetch,
    prefetch_steps: Annotated[int, typer.Option("--prefetch-steps", help="Read the audio bytes of this many next plan steps ahead, neighbouring members of an object in one request (0 = off).")] = _D.prefetch_steps,
    prefetch_bytes: Annotated[int, typer.Option("--prefetch-bytes", help="Bytes the step prefetch holds ahead at most, per rank (and DataLoader worker).")] = _D.prefetch_bytes,
    skip_bad_audio: Annotated[bool, typer.Option("--skip-bad-audio", help="Skip utterances whose audio fails, log them to skipped-rank-*.jsonl.")] = _D.skip_bad_audio,
    checkpoint_every: Annotated[int, typer.Option(help="Save every N steps (0 = only at the end).")] = _D.checkpoint_every,
    trace: Annotated[bool, typer.Option("--trace", help="Write trace-rank-*.jsonl: ids and tensor hash per step.")] = _D.trace,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = _D.device,
    timeout: Annotated[float, typer.Option(help="Seconds before a hung collective / rank is reported.")] = _D.timeout_s,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Where the memory-mapped manifest columns are cached (default: the tool's cache directory).")] = _D.cache_dir,
    quiet: Annotated[bool, typer.Option("--quiet", help="No per-step lines on stdout.")] = _D.quiet,
    dynamic_resolution: Annotated[bool, typer.Option("--dynamic-resolution/--no-dynamic-resolution", help="For a plan made with --dynamic-resolution: featurize each utterance at the rate that gives its batch's target frames (off: 10 ms hop, ordinary padding).")] = _D.dynamic_resolution,
    features: Annotated[str, typer.Option("--features", help="Log-mel front end: ours, nemo (NeMo's AudioToMelSpectrogramPreprocessor defaults) or canary-1b (Canary-1B's preprocessor config); the model's mel count.")] = _D.features,
    resampler: Annotated[str, typer.Option("--resampler", help="Resampling to 16 kHz: soxr (HQ) or lhotse (the samples NeMo's Lhotse dataloader gives).")] = _D.resampler,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --checkpoint-dir (refused without this or --resume).")] = _D.overwrite,
    allow_other_tokenizer: Annotated[bool, typer.Option("--allow-other-tokenizer", help="Train with a tokenizer other than the one the manifest was compiled with.")] = _D.allow_other_tokenizer,
) -> None:
    """Train a reference model on the plan with DDP (gloo on CPU, nccl on GPU); one JSON line per step."""
    cfg = build_options(TrainConfig, TRAIN_FLAGS, plan_dir=plan_dir, manifest=manifest, tokenizer=list(tokenizer),
                        checkpoint_dir=checkpoint_dir, model=model, steps=steps, resume=resume, lr=lr, seed=seed,
                        workers=workers, prefetch=prefetch, prefetch_steps=prefetch_steps,
                        prefetch_bytes=prefetch_bytes, skip_bad_audio=skip_bad_audio,
                        checkpoint_every=checkpoint_every, trace=trace, device=device, timeout_s=timeout,
                        cache_dir=cache_dir, quiet=quiet, dynamic_resolution=dynamic_resolution,
                        features=features, resampler=resampler, overwrite=overwrite,
                        allow_other_tokenizer=allow_other_tokenizer)
    refuse_same_paths({"PLAN": plan_dir, "--manifest": manifest, **{f"--tokenizer {t}": t.partition("=")[2] or t
                                                                  for t in tokenizer}},
                      {"--checkpoint-dir": checkpoint_dir})
    require("torch", "dataprep train")
    from dataprep.training import train

    with option_flags(TRAIN_FLAGS):
        summary = train(cfg, nproc=nproc)
    if summary.get("rank", 0) == 0:
        out.print(end_line(plan_dir, summary["next_step"], steps) + f"; checkpoint -> {checkpoint_dir / 'last.pt'}")


def end_line(plan_dir: Path, next_step: int, steps: int | None) -> str:
    """Why the run stopped: the plan's end (whatever ``--steps`` asked beyond it) or ``--steps``."""
    from manifests.plan_meta import read_plan_meta

    n = read_plan_meta(plan_dir).num_steps
    if next_step >= n:
        return f"trained to step {next_step}: the plan's end (plan.json num_steps {n})"
    return f"trained to step {next_step} (--steps {steps}; the plan goes on to step {n}: --resume continues)"
