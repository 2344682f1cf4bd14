"""Commands: fit-buckets (equal-occupancy 2D buckets → buckets.json) and padding (the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bucketing.balance import DEFAULT_BALANCE
from bucketing.bucket_order import DEFAULT_AUDIO_WEIGHT
from bucketing.dynres import DynResConfig
from bucketing.packing import DEFAULT_AUDIO_TOKEN_RATE
from bucketing.step_figures import steps_rows_warnings
from dataprep.cli import dynres as dyn
from dataprep.cli.app import (alias, app, build_options, defaults_of, option_flags, out,
                              parse_memory_limit, parse_world_sizes, user_errors)
from dataprep.cli.fmt import Table, plural
from dataprep.analysis import FitOptions, fit_buckets_file, manifest_padding_report
from manifests.atomic_files import write_json
from manifests.buckets_file import BucketSpec
from manifests.outputs import refuse_same_paths
from manifests.options import check_needs


def _bucket_table(spec: BucketSpec) -> Table:
    total_h = sum(b.hours or 0.0 for b in spec.buckets) or 1.0
    table = Table(title="buckets", show_lines=False)
    for col in ("#", "duration (s)", "tokens", "batch", "utterances", "hours", "share of audio"):
        table.add_column(col, justify="right")
    for b in spec.buckets:
        lo = "" if b.min_duration is None else f"{b.min_duration:.3f}"
        table.add_row(str(b.index), f"{lo}..{b.max_duration:.3f}", f"<= {b.max_tokens}", str(b.batch_size),
                      f"{b.num_utterances:,}", f"{b.hours:.2f}", f"{100 * (b.hours or 0) / total_h:.2f}%")
    return table


_FIT = defaults_of(FitOptions)


@app.command("fit-buckets")
@user_errors
def fit_buckets_cmd(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest (Parquet).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="buckets.json to write.")] = Path("buckets.json"),
    num_buckets: Annotated[int, typer.Option(help="Duration bins (equal seconds of audio); a bin spanning more than 1.5x its shortest clip is split where its parts hold enough audio, and far-out clips get overflow bins, so the grid may hold more.")] = _FIT.num_buckets,
    num_subbuckets: Annotated[int, typer.Option(help="Token sub-bins per duration bin; 1 = 1D.")] = _FIT.num_subbuckets,
    max_duration_budget: Annotated[Optional[float], typer.Option(help="Padded seconds of audio per batch.")] = _FIT.max_duration_budget,
    max_frames_budget: Annotated[Optional[int], typer.Option(help="Padded audio frames per batch.")] = _FIT.max_frames_budget,
    max_tokens_budget: Annotated[Optional[int], typer.Option(help="Padded tokens per batch.")] = _FIT.max_tokens_budget,
    frame_shift: Annotated[float, typer.Option(help="Seconds per frame for --max-frames-budget.")] = _FIT.frame_shift,
    strict: Annotated[bool, typer.Option("--strict", help="NeMo strict 2D: drop rows over their bin's tokens.")] = _FIT.strict,
    min_duration: Annotated[Optional[float], typer.Option(help="Leave out rows shorter than this (s), reported.")] = _FIT.min_duration,
    max_duration: Annotated[Optional[float], typer.Option(help="Leave out rows longer than this (s), reported.")] = _FIT.max_duration,
    duration_fence: Annotated[float, typer.Option(
        help="k of Q3 + k*IQR: longer rows form overflow buckets after the bins, one per 1.5x of length.")] = _FIT.duration_fence,
    token_fence: Annotated[float, typer.Option(
        help="k of Q3 + k*IQR per duration bin: rows with more tokens move to a later bin.")] = _FIT.token_fence,
    no_fences: Annotated[bool, typer.Option(
        "--no-fences", help="Plain equal occupancy: bounds at the maxima, no overflow buckets.")] = not _FIT.fences,
    cost_equal: Annotated[bool, typer.Option(
        "--cost-equal", help="Size every bucket's batch for the same predicted step time (never above the budget's size), so full batches of any buckets balance (plan-batches --balance).")] = _FIT.cost_equal,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", help="Memory the fit may hold, e.g. 4GiB (default: half the machine's). The manifest is streamed in blocks and its durations sorted in ranges of this size (the same buckets.json at any limit; spill files next to -o, 16 bytes per utterance).", show_default=False)] = None,
) -> None:
    """Fit equal-occupancy duration × token buckets, size batches by a padded budget, write buckets.json."""
    options = build_options(FitOptions, None, num_buckets=num_buckets, num_subbuckets=num_subbuckets,
                            max_duration_budget=max_duration_budget, max_frames_budget=max_frames_budget,
                            max_tokens_budget=max_tokens_budget, frame_shift=frame_shift, strict=strict,
                            min_duration=min_duration, max_duration=max_duration, duration_fence=duration_fence,
                            token_fence=token_fence, fences=not no_fences, cost_equal=cost_equal,
                            memory_limit=None if memory_limit is None else parse_memory_limit(memory_limit))
    res = fit_buckets_file(manifest, output, options)
    spec = res.spec
    out.print(_bucket_table(spec))
    for reason, (rows, secs) in sorted(res.dropped.items()):
        out.print(f"left out: {plural(rows, 'row')} ({secs / 3600:.2f} h), reason {reason}")
    if res.moved:
        out.print(f"moved to a longer-duration bin for their tokens: {plural(res.moved, 'row')} "
                  f"(token outliers; they train there, none dropped)")
    for note in spec.fit.get("notes", []):
        out.print(f"note: {note}")
    out.print(f"wrote {output} ({plural(len(spec.buckets), 'bucket')})")


#: manifest_padding_report argument -> flag where the flag is not ``--argument-name``
PADDING_FLAGS = {"budget": "--max-duration-budget"}


@app.command("padding")
@user_errors
def padding_cmd(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest (Parquet).")],
    buckets: Annotated[Path, typer.Option("--buckets", "-b", help="buckets.json (fitted or hand-written).")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the report as JSON.")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Folder for grid.png and schemes.png.")] = None,
    max_duration_budget: Annotated[Optional[float], typer.Option("--max-duration-budget", help="Padded seconds of audio per batch, as fit-buckets --max-duration-budget (default: the one buckets.json was sized with).", show_default=False)] = None,
    budget: Annotated[Optional[float], typer.Option("--budget", hidden=True, help="Old name of --max-duration-budget.", show_default=False)] = None,
    cumulative_budget: Annotated[Optional[float], typer.Option(help="Real seconds per batch, 1D cumulative scheme (Canary-1B: 360).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Allocate as NeMo strict 2D.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the shuffles.")] = 0,
    window: Annotated[Optional[int], typer.Option(help="Batches per grouping window (1 = plain shuffle).")] = None,
    sort_by: Annotated[Optional[str], typer.Option(help="auto, both, tokens, duration or none.")] = None,
    audio_weight: Annotated[float, typer.Option(
        help="Grouping cost: a point of audio padding counts as this many of token padding.")] = DEFAULT_AUDIO_WEIGHT,
    carry: Annotated[bool, typer.Option("--carry/--no-carry", help="A bucket's leftover rows fill the next bucket that holds them instead of a small last batch (as plan-batches does).")] = True,
    target_frames: dyn.TargetFramesOpt = dyn.DYNRES_DEFAULTS.target_frames,
    frames_per_second: dyn.FramesPerSecondOpt = dyn.DYNRES_DEFAULTS.frames_per_second,
    min_rate: dyn.MinRateOpt = dyn.DYNRES_DEFAULTS.min_rate,
    max_rate: dyn.MaxRateOpt = dyn.DYNRES_DEFAULTS.max_rate,
    floor_rate: dyn.FloorRateOpt = dyn.DYNRES_DEFAULTS.floor_rate,
    world_sizes: Annotated[Optional[str], typer.Option("--world-sizes", help="Comma-separated world sizes: also report the steps plan-batches would make (fill, straggler, same-bucket share) with one bucket per step and with --balance.")] = None,
    balance: Annotated[float, typer.Option("--balance", help="Balance tolerance for --world-sizes (as plan-batches --balance).")] = DEFAULT_BALANCE,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", help="Memory the report may hold, e.g. 4GiB (default: half the machine's). A larger corpus is read from spill files next to the manifest (the same figures, --world-sizes too; memory bounded by its largest bucket).", show_default=False)] = None,
    pack: Annotated[Optional[int], typer.Option("--pack", help="Also compare fixed, 2D and packed sequences of N token-equivalents (as plan-batches --pack) in audio, tokens and token-equivalents.", show_default=False)] = None,
    audio_token_rate: Annotated[float, typer.Option("--audio-token-rate", help="With --pack: audio tokens per second (te = ceil(duration x rate) + num_tokens).")] = DEFAULT_AUDIO_TOKEN_RATE,
) -> None:
    """Print what each batching scheme would waste on this manifest: fixed 30/40 s, 1D, 2D,
    2D + dynamic resolution (frame padding, clamped utterances, batches that fell back)."""
    refuse_same_paths({"MANIFEST": manifest, "--buckets": buckets}, {"--json": json_out})
    dynres = dyn.dynres_config(target_frames, frames_per_second, min_rate, max_rate, floor_rate)
    ws = parse_world_sizes("--world-sizes", world_sizes) if world_sizes else []
    budget = alias("--max-duration-budget", max_duration_budget, "--budget", budget)
    check_needs("--balance", balance != DEFAULT_BALANCE, "--world-sizes", bool(ws))
    check_needs("--audio-token-rate", audio_token_rate != DEFAULT_AUDIO_TOKEN_RATE, "--pack", pack is not None)
    with option_flags(PADDING_FLAGS):  # the library checks every value; errors name the flag
        report = manifest_padding_report(manifest, buckets, budget=budget, cumulative_budget=cumulative_budget,
                                         strict=strict, seed=seed, window=window, sort_by=sort_by,
                                         audio_weight=audio_weight, carry=carry, dynamic_resolution=dynres,
                                         world_sizes=ws, balance=balance, pack=pack, audio_token_rate=audio_token_rate,
                                         memory_limit=None if memory_limit is None else parse_memory_limit(memory_limit))
    _print_padding(report, dynres)
    if json_out is not None:
        write_json(report, json_out)
        out.print(f"wrote {json_out}")
    if plots is not None:
        from dataprep.report.plots import write_padding_plots

        for p in write_padding_plots(report, plots):
            out.print(f"wrote {p}")


def _print_padding(report: dict[str, Any], dynres: DynResConfig) -> None:
    """The padding report's tables: schemes, 2D buckets, steps per world size."""
    budget = report["budget"]
    table = Table(title=f"padding, {budget:g} s padded audio per batch")
    for col in ("scheme", "audio padding", "token padding", "mean batch", "batches", "rows left out"):
        table.add_column(col, justify="right")
    for name, s in report["schemes"].items():
        table.add_row(name, f"{100 * s['audio_padding']:.2f}%", f"{100 * s['token_padding']:.2f}%",
                      f"{s['mean_batch_size']:.1f}", f"{s['num_batches']:,}", f"{s['excluded']:,}")
    out.print(table)
    dr = report["schemes"]["2d-dynamic-resolution"]
    out.print(f"2D + dynamic resolution (target {dynres.target_frames}, {dynres.frames_per_second:g} Hz base, "
              f"{dynres.min_rate:g}-{dynres.max_rate:g} Hz, floor {dynres.floor_rate:g} Hz): frame padding {dr['frame_padding']:.2%} (vs {dr['frame_padding_base']:.2%} at the "
              f"base rate), {dr['clamped_share']:.2%} of utterances clamped, {dr['fallback_share']:.2%} of batches "
              f"fell back, {dr['off_rate_share']:.2%} of frames more than 10% off the base rate")
    print_policy_comparison(dr.get("compare", []))
    pb = Table(title="2D buckets (dyn res = 2D + dynamic resolution)")
    for col in ("#", "max dur (s)", "max tok", "batch", "utterances", "batches", "audio pad", "token pad",
                "dyn pad", "clamped", "fell back"):
        pb.add_column(col, justify="right")
    for b in report["per_bucket"]:
        pb.add_row(str(b["index"]), f"{b['max_duration']:.3f}", str(b["max_tokens"]), str(b["batch_size"]),
                   f"{b['num_rows']:,}", str(b["num_batches"]), f"{100 * b['audio_padding']:.1f}%",
                   f"{100 * b['token_padding']:.1f}%", f"{100 * b['dynres_frame_padding']:.2f}%",
                   f"{100 * b['dynres_clamped_share']:.1f}%", f"{100 * b['dynres_fallback_share']:.1f}%")
    out.print(pb)
    if "per_corpus" in report:
        pc = Table(title="2D scheme per corpus")
        for col in ("corpus", "utterances", "hours", "audio pad", "token pad"):
            pc.add_column(col, justify="left" if col == "corpus" else "right")
        for c in report["per_corpus"]:
            pc.add_row(c["corpus"], f"{c['utterances']:,}", f"{c['hours']:.3f}", f"{100 * c['padding_audio']:.1f}%",
                       f"{100 * c['padding_tokens']:.1f}%")
        out.print(pc)
    if "currencies" in report:
        cur = report["currencies"]
        ct = Table(title=f"fixed vs 2D vs packed (sequences of {cur['max_tokens']:,} token-equivalents, "
                         f"{cur['audio_token_rate']:g} audio tokens/s): padding in each currency")
        for col in ("scheme", "audio", "tokens", "token-equivalents", "rows", "rows left out"):
            ct.add_column(col, justify="right")
        for name, s in cur["schemes"].items():
            ct.add_row(name, f"{s['audio_padding']:.2%}", f"{s['token_padding']:.2%}", f"{s['te_padding']:.2%}",
                       f"{s['num_rows']:,}", f"{s['excluded']:,}")
        out.print(ct)
    if "steps" in report:
        st = Table(title="steps per epoch at each world size (fill = mean batch / mean batch at W=1; bound = "
                         "B / (W ceil(B/W)); straggler = mean max/mean predicted rank time - 1)")
        for col in ("W", "balance", "steps", "fill", "bound", "straggler", "same bucket", "padded max/mean",
                    "> 1.10", "audio pad", "token pad"):
            st.add_column(col, justify="right")
        for r in report["steps"]:
            st.add_row(str(r["world_size"]), f"{r['balance']:g}", str(r["steps"]), f"{r['fill']:.3f}",
                       f"{r['bound']:.3f}", f"{r['straggler']:.1%}", f"{r['same_bucket']:.1%}",
                       f"{r['balance_mean']:.3f}", f"{r['balance_over_1_10']:.1%}", f"{r['padding_audio']:.2%}",
                       f"{r['padding_tokens']:.2%}")
        out.print(st)
        for w in steps_rows_warnings(report["steps"]):
            out.print(f"warning: {w}")


def print_policy_comparison(rows: list[dict[str, Any]]) -> None:
    """The same batches under 2D bucketing and dynamic resolution at each target
    (:func:`bucketing.dynres.comparison_rows`)."""
    if not rows:
        return
    t = Table(title="2D vs dynamic resolution, same batches (encoder frames = batch size x frames, per epoch)")
    for col in ("policy", "encoder frames", "vs 2D", "frame padding", "mean batch", "off rate >10%", "clamped",
                "fell back"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["policy"], f"{r['encoder_frames']:,}", f"{r['vs_2d']:.3f}", f"{r['frame_padding']:.2%}",
                  f"{r['mean_batch']:.1f}", f"{r['off_rate_share']:.1%}", f"{r['clamped_share']:.1%}",
                  f"{r['fallback_share']:.1%}")
    out.print(t)
