"""Command: oomptimize (largest batch per bucket that fits, measured on a GPU or estimated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dataprep.cli_app import app, err, out, user_errors
from manifests.buckets_file import read_buckets, write_buckets
from manifests.errors import DataprepError


@app.command()
@user_errors
def oomptimize(
    buckets: Path = typer.Argument(..., help="buckets.json to size (bounds: max_duration s, max_tokens)."),
    model: str = typer.Option(..., "--model", help="canary-1b, canary-1b-flash, canary-180m-flash, small, tiny, or pkg.module:factory."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the sized buckets.json (may be the input)."),
    estimate: bool = typer.Option(False, "--estimate", help="Estimate peak memory without a GPU (needs --gpu-memory)."),
    device: str = typer.Option("cuda", "--device", help="Device the probes run on (cuda, cuda:1; cpu = dry run)."),
    gpu_memory: str | None = typer.Option(None, "--gpu-memory", help="Device memory, e.g. 80GiB (caps a real GPU's)."),
    memory_fraction: float = typer.Option(0.9, "--memory-fraction", help="Share of device memory a step may use."),
    margin: str = typer.Option("5%", "--margin", help="Headroom below the fraction against memory creep (size or % of memory)."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Stop bisecting when the gap is below this share of the batch."),
    max_batch: int = typer.Option(4096, "--max-batch", help="Largest batch size tried."),
    max_tps: float = typer.Option(20.0, "--max-tps", help="Tokens per second assumed for buckets without max_tokens."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Probe cache (default ~/.cache/speech-dataprep/oom)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Probe everything again; do not read or write the cache."),
) -> None:
    """Set each bucket's batch size to the largest one whose full training step (forward,
    loss, backward, AdamW step, bf16 autocast) fits in memory, and record how in
    batch_size_source."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DataprepError("oomptimize needs torch: install the torch extra (pip install 'speech-dataprep[torch]')") from None
    from rich.progress import Progress

    from oom.cache import DEFAULT_CACHE_DIR
    from oom.optimize import oomptimize as run, parse_bytes

    spec = read_buckets(buckets)
    mem = parse_bytes(gpu_memory) if gpu_memory is not None else None
    cdir = None if no_cache else str(cache_dir or DEFAULT_CACHE_DIR)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("oomptimize", total=len(spec.buckets))

        def done(i: int, res: Any) -> None:
            progress.update(task, advance=1, description=f"bucket {i}: batch {res.batch_size}")

        sized = run(
            spec, model, estimate=estimate, device=device, gpu_memory=mem, memory_fraction=memory_fraction,
            margin=margin, tolerance=tolerance, max_batch=max_batch, max_tps=max_tps, cache_dir=cdir, on_done=done,
        )
    write_buckets(sized, output)
    src = sized.batch_size_source
    out.print(f"{src['rule']}: {model} on {src['gpu']}, budget {src['budget_bytes'] / 2**30:.2f} GiB")
    out.print("bucket  max_duration  max_tokens  batch_size  peak_GiB  step_s")
    for b in sized.buckets:
        peak = b.extra.get("oom_peak_bytes")
        secs = b.extra.get("oom_step_seconds")
        out.print(
            f"{b.index:6d}  {b.max_duration:12.3f}  {str(b.max_tokens):>10}  {b.batch_size:10d}  "
            f"{(peak or 0) / 2**30:8.2f}  {'' if secs is None else f'{secs:.3f}':>6}"
        )
    out.print(f"wrote {output}")
