"""Commands: plan-batches (compile a rank-synchronized batch schedule), replan (continue a
plan at a step on another world size) and simulate (tail-worker idle time of a plan,
synchronized vs not). The work is in :mod:`dataprep.planning`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bucketing.costmodel import CostModel
from bucketing.dynres import LONGEST
from dataprep.cli.app import app, build_options, parse_memory_limit, check_range, defaults_of, option_flags, out, parse_world_sizes, user_errors
from dataprep.cli.fmt import Table, pct, plural
from dataprep.cli.buckets import print_policy_comparison
from manifests.nemo_buckets import nemo_options_warnings, token_equivalent_duration
from dataprep.cli import dynres as dyn
from dataprep.planning import DEFAULT_WORLD_SIZES, PlanOptions, build_plan, default_manifest, replan
from dataprep.planning import spills_to_disk
from dataprep.planning.options import parse_rank_speed
from dataprep.planning.stages import parse_stage
from dataprep.planning.simulate import (MAX_EXCHANGE_S, MAX_SLOW_FACTOR, StoreReads, pack_report, plan_steps_report,
                                       plan_warnings, simulate_strategies, simulate_with_warnings, store_reads)
from dataprep.planning.step_reads import StoreModel
from dataprep.cli.progress import progress_counter
from manifests.errors import DataprepError
from manifests.options import check_needs
from manifests.outputs import refuse_same_paths
from manifests.plan_files import verify_plan
from manifests.plan_meta import PlanMeta, read_plan_meta

#: PlanOptions field -> flag where the flag is not ``--field-name``
PLAN_FLAGS = {"at_step": "--at-step", "cost": "--coef", "stages": "--stage"}
RANK_SPEED_HELP = ("Ranks of different speeds (mixed GPU types): 1,1,0.7,... (one per rank, 0.5 = twice as slow), "
                   "a costmodel.json of `dataprep calibrate` (its measured rank speeds) or a text file of them; "
                   "a slower rank gets smaller batches so a step's ranks finish together (balanced steps only).")
#: simulate_plan / simulate_strategies argument -> flag
SIM_FLAGS = {"slow": "--slow-rank", "cost": "--coef", "rank_speed": "--rank-speed", "store": "--store"}
_PLAN = defaults_of(PlanOptions)


@app.command("plan-batches")
@user_errors
def plan_batches_cmd(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest (Parquet), e.g. kept.parquet.")],
    buckets: Annotated[Path, typer.Option("--buckets", "-b", help="buckets.json with a batch_size per bucket.")],
    world_size: Annotated[int, typer.Option("--world-size", "-w", help="Number of ranks (GPUs).")],
    out_dir: Annotated[Path, typer.Option("-o", "--output", help="Plan directory to write (replaced if it holds a plan).")],
    seed: Annotated[int, typer.Option("--seed", help="Seed; with the epoch number it fixes every order.")] = _PLAN.seed,
    epochs: Annotated[int, typer.Option("--epochs", "-e", help="Epochs to plan.")] = _PLAN.epochs,
    strict: Annotated[bool, typer.Option("--strict", help="Strict 2D allocation: drop rows over their bin's tokens.")] = _PLAN.strict,
    interleave: Annotated[str, typer.Option("--interleave", help="Step order across buckets: random (default) or ascending (short first).")] = _PLAN.interleave,
    row_group_steps: Annotated[int, typer.Option("--row-group-steps", help="Steps per Parquet row group (seek unit).")] = _PLAN.row_group_steps,
    carry: Annotated[bool, typer.Option("--carry/--no-carry", help="A bucket's leftover rows fill the next bucket that holds them instead of a small last batch.")] = _PLAN.carry,
    dynamic_resolution: Annotated[bool, typer.Option("--dynamic-resolution", help="Record per batch its target frames (--target-frames); loaders featurize each utterance at the rate that gives that length.")] = False,
    target_frames: dyn.TargetFramesOpt = dyn.DYNRES_DEFAULTS.target_frames,
    frames_per_second: dyn.FramesPerSecondOpt = dyn.DYNRES_DEFAULTS.frames_per_second,
    min_rate: dyn.MinRateOpt = dyn.DYNRES_DEFAULTS.min_rate,
    max_rate: dyn.MaxRateOpt = dyn.DYNRES_DEFAULTS.max_rate,
    floor_rate: dyn.FloorRateOpt = dyn.DYNRES_DEFAULTS.floor_rate,
    balance: Annotated[float, typer.Option("--balance", help="Balanced steps: full batches whose predicted step times agree within this relative tolerance, one bucket's where the data allows, several buckets' otherwise; 0 = one bucket per step on every rank (identical buckets, smaller batches at fine-tuning scale).")] = _PLAN.balance,
    coef: Annotated[Optional[list[str]], typer.Option("--coef", help=f"Cost coefficient NAME=VALUE for --balance ({', '.join(CostModel.names())}).")] = None,
    cost_model: Annotated[Optional[Path], typer.Option("--cost-model", help="costmodel.json written by `dataprep calibrate`: balance steps by the step times a run measured (--coef overrides single coefficients).", show_default=False)] = None,
    cost_equal: Annotated[Optional[bool], typer.Option("--cost-equal/--no-cost-equal", help="Size every bucket's batch for the same predicted step time (the buckets' sizes as memory caps). Default: on with --cost-model, off without.", show_default=False)] = None,
    sync_group: Annotated[Optional[int], typer.Option("--sync-group", help="Ranks synchronized together (divides --world-size; default all): each group of consecutive ranks draws the steps in its own order (1 = independent learners, for ADPSGD).")] = None,
    weights: Annotated[Optional[list[str]], typer.Option("--weights", help="CORPUS=WEIGHT, once per corpus of the manifest's corpus column: a weighted plan (replaces the blend the manifest records).")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="Re-weighting temperature T (weights become w^T / sum w^T at every level, as NeMo's reweight_temperature); replaces the blend's.")] = None,
    epoch_utterances: Annotated[Optional[int], typer.Option("--epoch-utterances", help="Weighted plans: utterances per epoch (default: the manifest's rows in a bucket).")] = None,
    epoch_hours: Annotated[Optional[float], typer.Option("--epoch-hours", help="Weighted plans: about this many hours per epoch.")] = None,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", help="Memory the planner may hold, e.g. 4GiB (default: half the machine's). A corpus within it is held in memory; a larger one is spilled by bucket next to -o (the same plan; memory bounded by its largest bucket).", show_default=False)] = None,
    rank_speed: Annotated[Optional[str], typer.Option("--rank-speed", help=RANK_SPEED_HELP, show_default=False)] = None,
    weight_window: Annotated[Optional[int], typer.Option("--weight-window", help="Weighted plans: order each epoch's steps so every this many consecutive steps hold each corpus within --weight-tolerance of its share (balanced steps, random interleave, no sync groups); windows over it are counted in plan.json.", show_default=False)] = None,
    stage: Annotated[Optional[list[str]], typer.Option("--stage", help="EPOCHS:weights.yaml, once per stage in order: a staged blend (multi-stage data balancing), each stage that many epochs weighted by the file's corpus: weight mapping (replaces --weights; --epochs defaults to the stages' sum).", show_default=False)] = None,
    weight_tolerance: Annotated[float, typer.Option("--weight-tolerance", help="With --weight-window: a corpus's share of a window's utterances may differ from its share of the epoch by this much (absolute, e.g. 0.05 = 5 points).")] = _PLAN.weight_tolerance,
    pack: Annotated[Optional[int], typer.Option("--pack", help="Packed plan: whole utterances fill sequences of at most N token-equivalents (te = ceil(duration x --audio-token-rate) + num_tokens), per bucket; text-only rows (duration 0) fill the gaps. Shards carry each member's sequence and cu_seqlens (version 3).", show_default=False)] = None,
    audio_token_rate: Annotated[Optional[float], typer.Option("--audio-token-rate", help="Tokens per second of audio (1 / NeMo's token_equivalent_duration; 12.5 for 80 ms encoder frames): a row's size in token-equivalents, ceil(duration x RATE) + num_tokens, recorded in plan.json. Default: the --buckets YAML's token_equivalent_duration with use_multimodal_sampling, else 12.5 with --pack.", show_default=False)] = None,
    sequences_per_batch: Annotated[Optional[int], typer.Option("--sequences-per-batch", help="With --pack: sequences per batch in every bucket (default: each bucket's batch size over the most utterances of audio a sequence of it holds).", show_default=False)] = None,
    container_block: Annotated[Optional[int], typer.Option("--container-block", help="Order each bucket in shuffled blocks of this many containers (tar shards; a loose file is one), in stored order inside a block: a rank-step then reads at most twice as many containers, at a price in randomness printed after the plan.", show_default=False)] = None,
) -> None:
    """Compile a rank-synchronized batch schedule: plan.json + one Parquet shard per rank.

    A manifest of many corpora (compiled from an input_cfg with weights, or --weights) gets a
    weighted plan: each epoch holds exactly round(p_c x N) utterances of corpus c."""
    from dataprep.planning import parse_weights

    # the rate flags are checked even without --dynamic-resolution: a bad value is never ignored
    dynres = dyn.dynres_config(target_frames, frames_per_second, min_rate, max_rate, floor_rate)
    dyn.refuse_unused(dynamic_resolution, "--dynamic-resolution", target_frames, frames_per_second, min_rate,
                      max_rate, floor_rate)
    dynres = dynres if dynamic_resolution else None
    with option_flags(PLAN_FLAGS):
        pairs = parse_weights(weights)
    limit = None if memory_limit is None else parse_memory_limit(memory_limit)
    with option_flags(PLAN_FLAGS):
        stages = tuple(parse_stage(s) for s in stage) if stage else None
    if stages is not None and epochs == _PLAN.epochs:
        epochs = sum(n for n, _ in stages)
    audio_token_rate = _audio_token_rate(audio_token_rate, buckets)
    check_needs("--sequences-per-batch", sequences_per_batch is not None, "--pack", pack is not None)
    options = build_options(PlanOptions, PLAN_FLAGS, world_size=world_size, seed=seed, epochs=epochs, strict=strict,
                            interleave=interleave, row_group_steps=row_group_steps, carry=carry, balance=balance,
                            cost=_cost(coef, cost_model), cost_equal=cost_model is not None if cost_equal is None else cost_equal,
                            sync_group=sync_group, dynamic_resolution=dynres, weights=pairs,
                            temperature=temperature, epoch_utterances=epoch_utterances, epoch_hours=epoch_hours,
                            memory_limit=limit, rank_speed=None if rank_speed is None else parse_rank_speed(rank_speed),
                            weight_window=weight_window, weight_tolerance=weight_tolerance, stages=stages,
                            container_block=container_block, pack=pack, audio_token_rate=audio_token_rate,
                            sequences_per_batch=sequences_per_batch)
    check_needs("--weight-tolerance", weight_tolerance != _PLAN.weight_tolerance, "--weight-window",
                weight_window is not None)
    refuse_same_paths({"MANIFEST": manifest, "--buckets": buckets}, {"-o": out_dir})
    for w in nemo_options_warnings(buckets):
        out.print(f"warning: {w}", markup=False)
    label = "planning, spilled to disk" if _spills(manifest, options) else "planning"
    with progress_counter(f"{label} (shards written)", total=epochs * world_size) as advance, option_flags(PLAN_FLAGS):
        meta = build_plan(manifest, buckets, out_dir, options, on_progress=lambda done, total: advance(1),
                          on_phase=lambda what: advance(0, description=f"{label}: {what}"))
    print_plan(meta, out_dir)
    packed = meta.extra.get("pack")
    if packed:
        out.print(f"packed: {packed['rows']:,} rows ({packed['text_rows']:,} text-only) in {packed['sequences']:,} "
                  f"sequences of at most {packed['max_tokens']:,} token-equivalents ({packed['audio_token_rate']:g} "
                  f"audio tokens/s): slot use {pct(packed['slot_use'])}, "
                  f"{plural(packed['left_out_rows'], 'row')} left out", markup=False)
    _print_blocks(meta)


def _print_blocks(meta: PlanMeta) -> None:
    """The price in randomness of a plan in container blocks (``plan.json``'s ``container_blocks``)."""
    blocks = meta.extra.get("container_blocks")
    if blocks:
        out.print(f"container blocks of {blocks['containers']}: a row's batch mates come from about "
                  f"{blocks['mates_rows']:,.0f} rows (its block) instead of {blocks['bucket_rows']:,.0f} (its bucket); "
                  "`dataprep simulate --reads` counts the containers each rank-step touches")


def _audio_token_rate(flag: float | None, buckets: Path) -> float | None:
    """``--audio-token-rate``, else the rate of the buckets YAML's multimodal sampling
    (``1 / token_equivalent_duration``); both given must agree."""
    check_range("--audio-token-rate", flag, gt=0)
    ted = token_equivalent_duration(buckets)
    if ted is None:
        return flag
    if flag is not None and abs(flag * ted - 1.0) > 1e-9:
        raise DataprepError(f"--audio-token-rate {flag:g} disagrees with {buckets}: token_equivalent_duration {ted:g} s "
                            f"is {1 / ted:g} tokens per second of audio")
    return 1.0 / ted if flag is None else flag


@app.command("replan")
@user_errors
def replan_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory to continue (written by plan-batches or replan).")],
    at_step: Annotated[int, typer.Option("--at-step", help="First global step not yet trained (the checkpoint's next step).")],
    out_dir: Annotated[Path, typer.Option("-o", "--output", help="New plan directory (replaced if it holds a plan).")],
    world_size: Annotated[Optional[int], typer.Option("--world-size", "-w", help="Number of ranks from that step on (default: the plan's).", show_default=False)] = None,
    manifest: Annotated[Optional[Path], typer.Option("--manifest", "-m", help="The plan's manifest (default: its recorded file name next to the plan directory).")] = None,
    exclude: Annotated[Optional[Path], typer.Option("--exclude", help="Ids never to train on from --at-step on: one id per line, or a Parquet file with an `id` column (a rejects file). Every other row stays exactly once per epoch.", show_default=False)] = None,
    carry: Annotated[bool, typer.Option("--carry/--no-carry", help="Carry bucket tails in the later epochs (as plan-batches).")] = _PLAN.carry,
    coef: Annotated[Optional[list[str]], typer.Option("--coef", help="Cost coefficient NAME=VALUE for a balanced plan.")] = None,
    cost_model: Annotated[Optional[Path], typer.Option("--cost-model", help="costmodel.json written by `dataprep calibrate`: balance the rest of the run by the step times measured so far.", show_default=False)] = None,
    cost_equal: Annotated[Optional[bool], typer.Option("--cost-equal/--no-cost-equal", help="Re-size every bucket's batch for the same predicted step time (the plan's sizes as memory caps). Default: on with --cost-model, off without.", show_default=False)] = None,
    sync_group: Annotated[Optional[int], typer.Option("--sync-group", help="Ranks synchronized together in the re-plan (divides --world-size; default the plan's).")] = None,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", help="Memory the re-plan may hold, e.g. 4GiB (default: half the machine's). A corpus within it is held in memory; a larger one is spilled next to -o (the same plan).", show_default=False)] = None,
    rank_speed: Annotated[Optional[str], typer.Option("--rank-speed", help=RANK_SPEED_HELP + " Default: the plan's, where the world size stays.", show_default=False)] = None,
    container_block: Annotated[Optional[int], typer.Option("--container-block", help="Order each bucket of the re-planned rest in shuffled blocks of this many containers, as plan-batches --container-block (default: the plan's).", show_default=False)] = None,
) -> None:
    """Continue a plan at --at-step on --world-size ranks: steps before it stay consumed; the
    rest of that epoch (exactly the utterances no rank has seen) and later epochs are re-planned
    (keeping the plan's sync groups and dynamic resolution). With --exclude, the ids it lists are
    never seen again (bad audio or labels found mid-run, the batches behind a loss spike)."""
    parent = read_plan_meta(plan_dir)
    options = build_options(PlanOptions, PLAN_FLAGS, world_size=parent.world_size if world_size is None else world_size,
                            carry=carry, cost=_cost(coef, cost_model),
                            cost_equal=cost_model is not None if cost_equal is None else cost_equal, sync_group=sync_group,
                            rank_speed=None if rank_speed is None else parse_rank_speed(rank_speed),
                            memory_limit=None if memory_limit is None else parse_memory_limit(memory_limit),
                            container_block=container_block)
    man = manifest if manifest is not None else default_manifest(plan_dir, parent)
    refuse_same_paths({"PLAN": plan_dir, "--manifest": man, **({"--exclude": exclude} if exclude else {})},
                      {"-o": out_dir})
    with option_flags(PLAN_FLAGS):  # --at-step is checked against the plan by replan()
        meta = replan(plan_dir, man, out_dir, options, at_step=at_step, exclude=exclude)
    print_plan(meta, out_dir)
    _print_blocks(meta)
    excluded = meta.extra.get("excluded")
    if exclude is not None and isinstance(excluded, dict):
        unknown = excluded.get("unknown_ids", 0)
        out.print(f"excluded from step {at_step} on: {plural(len(excluded['rows']), 'utterance')}"
                  + (f"; {plural(unknown, 'id')} of the exclusion files not in the manifest" if unknown else ""),
                  markup=False)


def _spills(manifest: Path, options: PlanOptions) -> bool:
    """Whether the plan spills to disk, past ``--memory-limit`` (False when the manifest cannot
    be read: the planner's own one-line error says why)."""
    try:
        return spills_to_disk(manifest, options)
    except (OSError, DataprepError, ValueError):
        return False


def _cost(coef: list[str] | None, cost_model: Path | None = None) -> CostModel:
    """The cost model of --cost-model (default: the built-in one), with --coef's overrides."""
    from dataprep.planning.calibrate import read_cost_model

    base = CostModel() if cost_model is None else read_cost_model(cost_model)
    try:
        return base.with_overrides(coef or [])
    except ValueError as exc:
        raise DataprepError(str(exc)) from None


def corpus_table(weighted: dict) -> Table:
    """Per corpus of a weighted plan: probability, quota, repeats, hours and padding per epoch."""
    t = weighted.get("temperature")
    table = Table(title=f"per corpus (per epoch of {weighted['epoch_quota']:,} utterances"
                        f"{'' if t is None else f', temperature {t:g}'}; weights from the {weighted['source']})")
    for col in ("corpus", "rows", "p", "quota", "times per row", "hours", "padding audio", "padding tokens"):
        table.add_column(col, justify="left" if col == "corpus" else "right")
    for c in weighted["corpora"]:
        lo, hi = c["repeats"]
        table.add_row(c["corpus"], f"{c['rows']:,}", f"{c['probability']:.4f}", f"{c['quota']:,}",
                      str(lo) if lo == hi else f"{lo}-{hi}", f"{c['hours_per_epoch']:.3f}",
                      f"{c['padding_audio']:.2%}", f"{c['padding_tokens']:.2%}")
    return table


def print_plan(meta: PlanMeta, out_dir: Path | str) -> None:
    """The plan summary a user reads after plan-batches."""
    spe = meta.steps_per_epoch
    out.print(f"plan: {out_dir}  world size {meta.world_size}, seed {meta.seed}, {plural(meta.epochs, 'epoch')}")
    if meta.sync_group is not None and meta.sync_group != meta.world_size:
        out.print(f"sync groups of {plural(meta.sync_group, 'rank')}: {plural(meta.world_size // meta.sync_group, 'group')}, "
                  "each with its own step order")
    if meta.replan is not None:
        rp = meta.replan
        out.print(f"re-planned from plan {rp.parent_plan_hash[:12]} (world size {rp.parent_world_size}) at step "
                  f"{rp.at_step}: its shards hold steps {rp.at_step}..{meta.num_steps - 1}")
    out.print(f"steps per epoch: {', '.join(map(str, spe)) if len(set(spe)) > 1 else spe[0]}  (total {meta.num_steps})")
    table = Table(title="per bucket (per epoch)")
    for col in ("bucket", "max_duration", "max_tokens", "batch_size", "steps", "batches", "utterances"):
        table.add_column(col, justify="right")
    for b, pb in zip(meta.buckets, meta.per_bucket):
        table.add_row(str(pb["bucket"]), f"{b['max_duration']:.3f}", str(b.get("max_tokens", "-")),
                      str(b["batch_size"]), str(pb["steps"]), str(pb["batches"]), str(pb["utterances"]))
    out.print(table)
    pad = meta.padding
    out.print(f"predicted padding: audio {pad['audio']:.2%}, tokens {pad['tokens']:.2%}")
    weighted = meta.extra.get("weights")
    if weighted:
        out.print(corpus_table(weighted))
    win = meta.extra.get("weight_window")
    if isinstance(win, dict):
        out.print(f"weight windows of {plural(win['window'], 'step')}: worst gap {win['worst_gap']:.1%} of a corpus's "
                  f"share (tolerance {win['tolerance']:.1%}); {win['windows_over']} of {win['windows']} windows over it"
                  + (f"; epochs {win['unordered_epochs']} not ordered (one bucket per step)"
                     if win["unordered_epochs"] else ""), markup=False)
    for st in meta.extra.get("stages") or []:
        quotas = ", ".join(f"{c['corpus']} {c['quota']}" for c in st["weights"]["corpora"])
        out.print(f"stage: epochs {st['epochs'][0]}-{st['epochs'][1]} from step {st['first_step']}: quotas {quotas}",
                  markup=False)
    speeds = meta.extra.get("rank_speed")
    if isinstance(speeds, list):
        out.print(f"rank speeds: {', '.join(f'{s:g}' for s in speeds)} (batches sized by speed)", markup=False)
    dr = meta.extra.get("dynamic_resolution")
    if dr:
        c = dr["config"]
        out.print(f"dynamic resolution ({c['frames_per_second']:g} Hz base, {c['min_rate']:g}-{c['max_rate']:g} Hz, "
                  f"floor {c['floor_rate']:g} Hz, target {c.get('target_frames', LONGEST)}): frame padding {dr['frame_padding']:.2%} "
                  f"(vs {dr['frame_padding_base']:.2%} at the base rate), {dr['clamped_share']:.2%} of utterances "
                  f"clamped, {dr['fallback_share']:.2%} of batches fell back, {dr['off_rate_share']:.2%} of frames "
                  f"more than 10% off the base rate; {dr['padded_frames']} encoder frames per plan "
                  f"(vs {dr['base_padded_frames']} with ordinary padding), mean batch {dr.get('mean_batch', 0.0):.1f}")
        print_policy_comparison([{**r, "encoder_frames": r["encoder_frames"] // meta.epochs} for r in dr.get("compare", [])])
    fb = meta.fallbacks
    left_out = sum(len(v) for v in meta.allocation["left_out"].values())
    out.print(f"fallbacks: {plural(fb['moved_rows'], 'row')} moved to a containing bucket, {fb['dropped_rows']} dropped, "
              f"{plural(fb['broken_sync_steps'], 'unsynchronized step')}; {plural(fb['resplit_buckets'], 'bucket tail')} "
              f"re-split (sync kept); {plural(left_out, 'row')} outside the bucket grid")
    if meta.balance is not None:
        bl = meta.balance
        mode = f"balanced within {bl.tolerance:g}" if bl.tolerance > 0 else "one bucket per step"
        out.print(f"steps ({mode}): fill {bl.fill:.1%} of the buckets' batch sizes (mean batch {bl.mean_batch:.1f}), "
                  f"same-bucket steps {bl.same_bucket:.1%}, predicted straggler {bl.straggler:.1%} "
                  f"(idle {bl.idle:.1%}), padded audio max/mean {bl.balance_mean:.3f} "
                  f"(> 1.10 on {bl.balance_over_1_10:.1%} of steps); {plural(bl.split_batches, 'batch')} split, "
                  f"{plural(bl.unbalanced_steps, 'step')} over the tolerance")
    for w in plan_warnings(meta):
        out.print(f"warning: {w}", markup=False)
    out.print(f"plan hash: {meta.plan_hash}")


@app.command("simulate")
@user_errors
def simulate_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory written by plan-batches.")],
    manifest: Annotated[Optional[Path], typer.Option("--manifest", "-m", help="The plan's manifest (recompute batch lengths).")] = None,
    world_sizes: Annotated[str, typer.Option("--world-sizes", help="Comma-separated world sizes to simulate besides the plan's.")] = ",".join(map(str, DEFAULT_WORLD_SIZES)),
    coef: Annotated[Optional[list[str]], typer.Option("--coef", help=f"Cost coefficient NAME=VALUE ({', '.join(CostModel.names())}).")] = None,
    epoch: Annotated[int, typer.Option("--epoch", help="Epoch to simulate.")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed for dealing batches at other world sizes.")] = 0,
    strategy: Annotated[Optional[str], typer.Option("--strategy", help="Also simulate training strategies on the plan: sync, adpsgd, hybrid, or a comma-separated list.")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", help="Ranks per synchronous group for hybrid (default: the plan's --sync-group, else 8).")] = None,
    slow_rank: Annotated[Optional[list[str]], typer.Option("--slow-rank", help="RANK=FACTOR: that rank's batches take FACTOR times longer (e.g. 3=1.5).")] = None,
    exchange: Annotated[float, typer.Option("--exchange", help="Seconds per ADPSGD pairwise weight exchange (one per step).")] = 0.005,
    rank_speed: Annotated[Optional[str], typer.Option("--rank-speed", help="The ranks' speeds to simulate the plan's steps with (as plan-batches --rank-speed; default: the plan's, else alike).", show_default=False)] = None,
    reads: Annotated[bool, typer.Option("--reads", help="Also the requests and bytes each rank-step reads from a store, and the time to first batch and input throughput a store model predicts (needs --manifest).")] = False,
    store: Annotated[Optional[list[str]], typer.Option("--store", help=f"Store model NAME=VALUE for --reads ({', '.join(StoreModel.names())}).")] = None,
) -> None:
    """Tail-worker simulation: idle fraction of ranks waiting for the slowest, synchronized vs not;
    with --reads, also what each rank-step reads from a store."""
    check_range("--exchange", exchange, ge=0, le=MAX_EXCHANGE_S)  # refused even where no --strategy uses it
    ws = parse_world_sizes("--world-sizes", world_sizes)
    try:
        cost = CostModel().with_overrides(coef or [])
    except ValueError as exc:
        raise DataprepError(str(exc)) from None
    slow = _slow_ranks(slow_rank or [])
    speed = None if rank_speed is None else parse_rank_speed(rank_speed)
    strategies = [x.strip() for x in strategy.split(",") if x.strip()] if strategy else []
    check_needs("--slow-rank", bool(slow), "--strategy", bool(strategies))
    check_needs("--exchange", exchange != 0.005, "--strategy adpsgd or hybrid", bool({"adpsgd", "hybrid"} & set(strategies)))
    check_needs("--group-size", group_size is not None, "--strategy hybrid", "hybrid" in strategies)
    check_needs("--reads", reads, "--manifest", manifest is not None)
    check_needs("--store", bool(store), "--reads", reads)
    with option_flags(SIM_FLAGS):
        store_model = StoreModel().with_overrides(store or [])
    with option_flags(SIM_FLAGS):  # the library checks every value (finite, in range)
        results, warnings = simulate_with_warnings(plan_dir, ws, cost, manifest=manifest, epoch=epoch, seed=seed,
                                                   speed=speed)
    out.print(f"tail-worker simulation, epoch {epoch}; cost model: {cost}")
    with option_flags(SIM_FLAGS):
        rep = plan_steps_report(plan_dir, cost, epoch, speed=speed)
    out.print(f"plan's steps (world size {results[0].world_size}): {plural(rep.steps, 'step')}, fill {rep.fill:.1%} of the "
              f"buckets' batch sizes (mean batch {rep.mean_batch:.1f}), same-bucket steps {rep.same_bucket:.1%}, "
              f"predicted straggler {rep.straggler:.1%}, padded audio max/mean {rep.balance_mean:.3f} "
              f"(> 1.10 on {rep.balance_over_1_10:.1%} of steps)")
    packed = pack_report(plan_dir, epoch)
    if packed is not None:
        out.print(f"packed sequences of at most {packed.max_tokens:,} token-equivalents: {packed.sequences:,} holding "
                  f"{packed.members:,} rows, slot use {pct(packed.slot_use, 2)} (emptiest {pct(packed.emptiest)}, "
                  f"fullest {pct(packed.fullest)}), {packed.sequences_per_batch:.1f} sequences per batch, "
                  f"{packed.members_per_sequence:.1f} rows per sequence", markup=False)
    out.print("speedup = 1 - epoch time synchronized / epoch time unsynchronized (same batches)")
    head = ("world_size", "steps_sync", "steps_unsync", "idle_sync", "idle_unsync", "epoch_s_sync",
            "epoch_s_unsync", "speedup")
    out.print("  ".join(f"{h:>14}" for h in head))
    for r in results:
        cells = (r.world_size, r.steps_sync, r.steps_unsync, pct(r.idle_sync), pct(r.idle_unsync),
                 f"{r.time_sync:.1f}", f"{r.time_unsync:.1f}", pct(r.speedup))
        note = "" if r.representative else (
            f"  (only {plural(round(r.batches_per_bucket), 'batch', 'batches')} per bucket for {plural(r.world_size, 'rank')}: "
            "too small a corpus to say)")
        out.print("  ".join(f"{c:>14}" for c in cells) + note)
    for w in warnings:
        out.print(f"warning: {w}", markup=False)
    if reads and manifest is not None:
        print_store_reads(store_reads(plan_dir, manifest, epoch, store_model))
    if strategies:
        with option_flags(SIM_FLAGS):
            res = simulate_strategies(plan_dir, strategies, cost, group_size, slow, exchange, epoch, speed)
        out.print(f"strategies (exchange {exchange:g} s per ADPSGD step"
                  + (", slow " + ", ".join(f"rank {r} x{f:g}" for r, f in slow.items()) if slow else "") + ")")
        head = ("strategy", "group", "epoch_s", "utt/s", "idle", "staleness")
        out.print("  ".join(f"{h:>10}" for h in head))
        for r in res:
            cells = (r.strategy, r.group_size, f"{r.time:.1f}", f"{r.utt_per_s:.1f}", pct(r.idle), r.staleness)
            out.print("  ".join(f"{c:>10}" for c in cells))


def print_store_reads(r: StoreReads) -> None:
    """The reads per rank-step and what the store model predicts, as ``simulate`` prints them."""
    s = r.store
    out.print(f"store reads per rank-step (neighbours coalesced): requests mean {r.requests.mean():.1f} max "
              f"{int(r.requests.max())}, {r.nbytes.mean() / 1e6:.2f} MB mean, objects mean {r.objects.mean():.1f}; "
              f"fetched / used {r.fetched_per_used:.3f}"
              + (f"; {plural(r.unpriced, 'Parquet audio row')} not counted" if r.unpriced else ""))
    rate = "no limit" if s.request_rate is None else f"{s.request_rate:g} req/s"
    out.print(f"store model (latency {s.latency_s * 1e3:g} ms, {s.bandwidth / 1e6:g} MB/s, {rate}, "
              f"{s.concurrency} in flight per rank): first batch {r.first_batch_s:.3f} s, input "
              f"{r.steps_per_s:.1f} steps/s = {r.utt_per_s:.0f} utterances/s on the slowest rank")


def _slow_ranks(pairs: list[str]) -> dict[int, float]:
    """``RANK=FACTOR`` options as a dict (parsed only: the library checks the values)."""
    slow: dict[int, float] = {}
    for pair in pairs:
        rank, sep, factor = pair.partition("=")
        try:
            if not sep:
                raise ValueError
            slow[int(rank)] = float(factor)
        except ValueError:
            raise DataprepError(f"--slow-rank {pair!r}: expected RANK=FACTOR, e.g. 3=1.5") from None
        check_range("--slow-rank", slow[int(rank)], gt=0, le=MAX_SLOW_FACTOR)  # before the simulation runs
    return slow


@app.command("verify")
@user_errors
def verify_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory written by plan-batches.")],
    manifest: Annotated[Optional[Path], typer.Option("--manifest", "-m", help="Also check that this is the plan's manifest (content hash recomputed from every row).")] = None,
) -> None:
    """Check a plan end to end: plan.json valid, its plan_hash, and every shard's size, footer and
    full SHA-256 against plan.json (opening a shard checks only size and footer)."""
    from manifests.hash_cache import verify_manifest_rows

    meta = verify_plan(plan_dir)
    if manifest is not None:  # every row, block by block, not the cached facts
        verify_manifest_rows(manifest, meta.manifest.content_hash, "the plan's manifest")
    quota = ""
    if manifest is not None and "weights" in meta.extra:
        from dataprep.planning import check_quotas

        quota = f"; every corpus's quota in {plural(check_quotas(plan_dir, manifest), 'whole epoch')}"
    from dataprep.planning.exclude import check_exclusions

    excluded, from_step = check_exclusions(plan_dir, meta)
    quota += f"; no batch from step {from_step} on holds one of its {plural(excluded, 'excluded utterance')}" \
        if excluded else ""
    out.print(f"plan {plan_dir}: ok ({plural(meta.world_size, 'shard')}, {plural(meta.num_steps, 'step')}, plan hash "
              f"{meta.plan_hash[:16]}){'; manifest ok' if manifest is not None else ''}{quota}")
