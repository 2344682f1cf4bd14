"""Commands: ``train`` (the thin DDP loop over a plan) and ``export nemo|lhotse``.

torch is imported inside the commands, so the rest of the CLI works without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dataprep.cli_app import app, out, user_errors

export_app = typer.Typer(name="export", help="Export buckets, batch sizes and manifests for NeMo or Lhotse.",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(export_app, name="export")

PlanOrBuckets = Annotated[Path, typer.Argument(help="Plan directory (plan-batches) or buckets.json.")]
ManifestOpt = Annotated[Path, typer.Option("--manifest", "-m", help="The compiled manifest the buckets / plan were made from.")]
OutOpt = Annotated[Path, typer.Option("-o", "--out", help="Output folder.")]


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
) -> None:
    """Train a reference model on the plan with DDP (gloo on CPU, nccl on GPU); one JSON line per step."""
    from dataprep.train import TrainConfig, train

    if device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter("--device must be auto, cpu or cuda")
    cfg = TrainConfig(plan_dir=str(plan_dir), manifest=str(manifest), tokenizer=list(tokenizer),
                      checkpoint_dir=str(checkpoint_dir), model=model, steps=steps, resume=resume, lr=lr, seed=seed,
                      workers=workers, prefetch=prefetch, skip_bad_audio=skip_bad_audio,
                      checkpoint_every=checkpoint_every, trace=trace, device=device, timeout_s=timeout,
                      cache_dir=str(cache_dir) if cache_dir else None, quiet=quiet)
    summary = train(cfg, nproc=nproc)
    if summary.get("rank", 0) == 0:
        out.print(f"trained to step {summary['next_step']}; checkpoint -> {checkpoint_dir / 'last.pt'}")


@export_app.command("nemo")
@user_errors
def export_nemo_cmd(plan_or_buckets: PlanOrBuckets, manifest: ManifestOpt, out_dir: OutOpt) -> None:
    """bucket_duration_bins, bucket_batch_size, max_tps (bucketing.yaml) and NeMo JSONL manifests."""
    from dataprep.export import export_nemo

    cfg = export_nemo(plan_or_buckets, manifest, out_dir)
    out.print(f"{cfg['num_buckets']} buckets -> {out_dir / 'bucketing.yaml'}, manifest.jsonl, bucket-*.jsonl")


@export_app.command("lhotse")
@user_errors
def export_lhotse_cmd(plan_or_buckets: PlanOrBuckets, manifest: ManifestOpt, out_dir: OutOpt) -> None:
    """A Lhotse CutSet (cuts.jsonl.gz) and the bins / batch sizes for DynamicBucketingSampler (bins.json)."""
    from dataprep.export import export_lhotse

    bins = export_lhotse(plan_or_buckets, manifest, out_dir)
    out.print(f"{bins['num_cuts']} cuts -> {out_dir / 'cuts.jsonl.gz'}; {len(bins['duration_bins'])} bins -> {out_dir / 'bins.json'}")
