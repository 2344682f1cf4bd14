"""Command: oomptimize (largest batch per bucket that fits, measured on a GPU or estimated)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dataprep.cli.app import app, build_options, defaults_of, option_flags, out, user_errors
from dataprep.cli import dynres as dyn
from dataprep.cli.progress import progress_counter
from manifests.buckets_file import read_buckets, write_buckets
from bucketing.budget import cost_equal_spec
from bucketing.costmodel import CostModel
from manifests.errors import DataprepError
from manifests.options import check_needs
from manifests.hash_cache import default_cache_dir
from manifests.nemo_buckets import buckets_format, write_nemo_buckets
from manifests.optional import require
from manifests.units import parse_bytes
from oom.options import MODEL_NAMES, OomOptions
from oom.packed_estimate import SPEECH_LLMS, PackedOomOptions, size_packed_buckets


#: OomOptions field -> flag where the flag is not ``--field-name``
OOM_FLAGS: dict[str, str] = {}
_D = defaults_of(OomOptions)


@app.command("oomptimize")
@user_errors
def oomptimize_cmd(
    buckets: Annotated[Path, typer.Argument(help="buckets.json to size (bounds: max_duration s, max_tokens).")],
    model: Annotated[str, typer.Option("--model", help=f"{', '.join(MODEL_NAMES)}, or pkg.module:factory; with --pack: {', '.join(SPEECH_LLMS)}.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the sized buckets.json (may be the input).")],
    estimate: Annotated[bool, typer.Option("--estimate", help="Estimate peak memory without a GPU (needs --gpu-memory).")] = _D.estimate,
    device: Annotated[str, typer.Option("--device", help="Device the probes run on (cuda, cuda:1; cpu = dry run).")] = _D.device,
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", help="Device memory, e.g. 80GiB (caps a real GPU's).")] = None,
    memory_fraction: Annotated[float, typer.Option("--memory-fraction", help="Share of device memory a step may use.")] = _D.memory_fraction,
    margin: Annotated[str, typer.Option("--margin", help="Headroom below the fraction against memory creep (size or % of memory).")] = _D.margin,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Stop bisecting when the gap is below this share of the batch.")] = _D.tolerance,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest batch size tried.")] = _D.max_batch,
    max_tps: Annotated[float, typer.Option("--max-tps", help="Tokens per second assumed for buckets without max_tokens.")] = _D.max_tps,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Probe cache (default <cache>/oom: $SPEECH_DATAPREP_CACHE, else $XDG_CACHE_HOME/speech-dataprep, else ~/.cache/speech-dataprep).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Probe everything again; do not read or write the cache.")] = False,
    loss_mode: Annotated[str, typer.Option("--loss-mode", help="Transducers: batched (whole joint) or sample-wise (joint + loss + gradient per sample).")] = _D.loss_mode,
    exact_trace: Annotated[bool, typer.Option("--exact-trace", help="With --estimate: full traces per bucket instead of the fitted estimate (slow).")] = _D.exact_trace,
    explain: Annotated[bool, typer.Option("--explain", help="Per bucket, the memory at the peak by class (parameters, gradients, optimizer, activations, attention, joint).")] = _D.explain,
    out_format: Annotated[str | None, typer.Option("--format", help="json: buckets.json; nemo: NeMo's bucketing YAML (bucket_duration_bins, bucket_batch_size) for NeMo's own sampler (default: nemo for a .yaml / .yml -o, else json; must agree with it).")] = None,
    dynamic_resolution: Annotated[bool, typer.Option("--dynamic-resolution", help="Size each bucket at its dynamic-resolution shape (--target-frames; as plan-batches --dynamic-resolution with the same options).")] = False,
    target_frames: dyn.TargetFramesOpt = dyn.DYNRES_DEFAULTS.target_frames,
    frames_per_second: dyn.FramesPerSecondOpt = dyn.DYNRES_DEFAULTS.frames_per_second,
    min_rate: dyn.MinRateOpt = dyn.DYNRES_DEFAULTS.min_rate,
    max_rate: dyn.MaxRateOpt = dyn.DYNRES_DEFAULTS.max_rate,
    floor_rate: dyn.FloorRateOpt = dyn.DYNRES_DEFAULTS.floor_rate,
    cost_equal: Annotated[bool, typer.Option("--cost-equal", help="Then size every bucket for the same step time (measured on a device, else the cost model), never above its memory size: full batches of any buckets balance.")] = False,
    pack: Annotated[int | None, typer.Option("--pack", help=f"Packed batches of a speech-LLM ({', '.join(SPEECH_LLMS)}): sequences of N token-equivalents a step, by the shape estimate (with --estimate).", show_default=False)] = None,
    lora_rank: Annotated[int | None, typer.Option("--lora-rank", help="With --pack: LoRA rank on the LLM's attention (0: full fine-tuning; default: the model's).", show_default=False)] = None,
    audio_token_rate: Annotated[float | None, typer.Option("--audio-token-rate", help="With --pack: audio tokens per second, as plan-batches --pack (default: the model's).", show_default=False)] = None,
) -> None:
    """Set each bucket's batch size to the largest one whose full training step (forward,
    loss, backward, AdamW step, bf16 autocast) fits in memory, and record how in
    batch_size_source."""
    if out_format not in (None, "json", "nemo"):
        raise DataprepError(f"--format must be json or nemo (got {out_format!r})")
    with option_flags({"format": "--format"}):
        out_format = buckets_format(output, out_format)
    if pack is not None:
        used = [f for f, on in (("--dynamic-resolution", dynamic_resolution), ("--exact-trace", exact_trace),
                                ("--cost-equal", cost_equal), ("--format nemo", out_format == "nemo")) if on]
        if used:
            raise DataprepError(f"{used[0]}: not available with --pack (packed batches are sized by shape)")
        if not estimate or gpu_memory is None:
            raise DataprepError("--pack: packed batches are sized by the shape estimate (no GPU search of them yet): "
                                "add --estimate --gpu-memory SIZE (e.g. 80GiB)")
        options = build_options(PackedOomOptions, {"gpu_memory": "--gpu-memory"}, model=model, pack=pack,
                                gpu_memory=parse_bytes(gpu_memory, flag="--gpu-memory"), memory_fraction=memory_fraction,
                                margin=margin, max_batch=max_batch, max_tps=max_tps,
                                lora_rank=lora_rank, audio_token_rate=audio_token_rate)
        _packed(read_buckets(buckets), options, output, explain)
        return
    for flag, value in (("--lora-rank", lora_rank), ("--audio-token-rate", audio_token_rate)):
        check_needs(flag, value is not None, "--pack", False)
    cdir = None if no_cache else str(cache_dir or default_cache_dir() / "oom")
    # the rate flags are checked even without --dynamic-resolution: a bad value is never ignored
    dynres = dyn.dynres_config(target_frames, frames_per_second, min_rate, max_rate, floor_rate)
    dyn.refuse_unused(dynamic_resolution, "--dynamic-resolution", target_frames, frames_per_second, min_rate,
                      max_rate, floor_rate)
    check_needs("--exact-trace", exact_trace, "--estimate", estimate)
    options = build_options(OomOptions, OOM_FLAGS, model=model, estimate=estimate, device=device,
                            gpu_memory=parse_bytes(gpu_memory, flag="--gpu-memory") if gpu_memory is not None else None,
                            memory_fraction=memory_fraction, margin=margin, tolerance=tolerance, max_batch=max_batch,
                            max_tps=max_tps, cache_dir=cdir, loss_mode=loss_mode, exact_trace=exact_trace,
                            explain=explain, dynamic_resolution=dynres if dynamic_resolution else None)
    require("torch", "oomptimize")
    from oom.optimize import oomptimize as run

    spec = read_buckets(buckets)
    with progress_counter("oomptimize", total=len(spec.buckets)) as advance:

        def done(i: int, res: Any) -> None:
            advance(1, f"bucket {i}: batch {res.batch_size}")

        with option_flags(OOM_FLAGS):
            sized = run(spec, options, on_done=done)
    if cost_equal:
        sized = cost_equal_spec(sized, CostModel())
    if out_format == "nemo":
        write_nemo_buckets(sized.to_json()["buckets"], output)
    else:
        write_buckets(sized, output)
    src = sized.batch_size_source
    mode = f", {src['loss_mode']} loss" if src.get("loss_mode") else ""
    how = f", {src['estimator']} estimate" if src.get("estimator") else ""
    out.print(f"{src['rule']}: {model} on {src['gpu']}{mode}{how}, budget {src['budget_bytes'] / 2**30:.2f} GiB")
    out.print("bucket  max_duration  max_tokens  frames  batch_size  peak_GiB  step_s")
    for b in sized.buckets:
        peak = b.extra.get("oom_peak_bytes")
        secs = b.extra.get("oom_step_seconds")
        out.print(
            f"{b.index:6d}  {b.max_duration:12.3f}  {b.max_tokens!s:>10}  {b.extra['oom_shape']['frames']:6d}  "
            f"{b.batch_size:10d}  "
            f"{(peak or 0) / 2**30:8.2f}  {'' if secs is None else f'{secs:.3f}':>6}"
        )
    if explain:
        _print_breakdown(sized.buckets)
    out.print(f"wrote {output}")


def _print_breakdown(buckets: Any) -> None:
    """One row per bucket: GiB by class at the step's estimated peak."""
    classes = ("parameters", "gradients", "optimizer", "activations", "attention", "joint")
    out.print("bucket  batch_size  " + "  ".join(f"{c:>11}" for c in classes) + "  peak_GiB  peak_at")
    for b in buckets:
        br = b.extra["oom_breakdown"]
        cells = "  ".join(f"{br[c] / 2**30:11.2f}" for c in classes)
        out.print(f"{b.index:6d}  {b.batch_size:10d}  {cells}  {br['peak_bytes'] / 2**30:8.2f}  {br['phase']}")


def _packed(spec: Any, options: PackedOomOptions, output: Path, explain: bool) -> None:
    """Size ``spec`` for packed batches, write it and print a table per bucket."""
    sized = size_packed_buckets(spec, options)
    none = [b for b in sized.buckets if not b.extra["oom_sequences"]]
    if none:
        b = none[0]
        raise DataprepError(f"bucket {b.index} (max {b.max_duration:g} s, {b.max_tokens} tokens): no sequence of "
                            f"{options.pack} tokens fits the budget ({b.extra['oom_peak_bytes'] / 2**30:.2f} GiB for "
                            f"one, {options.budget / 2**30:.2f} GiB budget): lower --pack, use --lora-rank or more memory")
    write_buckets(sized, output)
    src = sized.batch_size_source
    out.print(f"{src['rule']}: {src['model']} (LoRA rank {src['lora_rank']}; 0 = full fine-tuning), "
              f"sequences of {options.pack} tokens at {src['audio_token_rate']:g} audio tokens/s, "
              f"budget {src['budget_bytes'] / 2**30:.2f} GiB of {src['gpu']}")
    out.print("bucket  max_duration  max_tokens  audio_share  sequences  batch_size  peak_GiB")
    for b in sized.buckets:
        out.print(f"{b.index:6d}  {b.max_duration:12.3f}  {b.max_tokens!s:>10}  {b.extra['oom_audio_share']:11.3f}  "
                  f"{b.extra['oom_sequences']:9d}  {b.batch_size:10d}  {b.extra['oom_peak_bytes'] / 2**30:8.2f}")
    if explain:
        classes = ("parameters", "gradients", "optimizer", "activations", "logits")
        out.print("bucket  " + "  ".join(f"{c:>11}" for c in classes) + "  (GiB)")
        for b in sized.buckets:
            out.print(f"{b.index:6d}  " + "  ".join(f"{b.extra['oom_breakdown'][c] / 2**30:11.2f}" for c in classes))
    fewest = min(b.extra["oom_sequences"] for b in sized.buckets)
    out.print(f"wrote {output}; for the same sequences in every bucket: plan-batches --pack {options.pack} "
              f"--sequences-per-batch {fewest}")
