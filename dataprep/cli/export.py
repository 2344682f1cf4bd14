"""Commands: ``export nemo`` and ``export lhotse`` (buckets, batch sizes and manifests for
NeMo or Lhotse training), and ``pack`` (audio into NeMo tarred / Lhotse Shar / WebDataset containers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dataprep.cli.app import alias, app, option_flags, out, user_errors
from dataprep.cli.fmt import plural
from manifests.outputs import refuse_same_paths

export_app = typer.Typer(name="export", help="Export buckets, batch sizes and manifests for NeMo or Lhotse.",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(export_app, name="export")

PlanOrBuckets = Annotated[Path, typer.Argument(help="Plan directory (plan-batches) or buckets.json.")]
ManifestOpt = Annotated[Path, typer.Option("--manifest", "-m", help="The compiled manifest the buckets / plan were made from.")]
OutOpt = Annotated[Path, typer.Option("-o", "--output", help="Output folder (replaced whole, atomically).")]
ChannelOpt = Annotated[Optional[int], typer.Option(help="Channel of multi-channel audio to train on (default: NeMo channel_selector 0; Lhotse keeps every channel as a MultiCut).", show_default=False)]
RejectsOpt = Annotated[Optional[Path], typer.Option(help="Write rows that are in no bucket here (Parquet) instead of stopping with an error.", show_default=False)]


@export_app.command("nemo")
@user_errors
def export_nemo_cmd(plan_or_buckets: PlanOrBuckets, manifest: ManifestOpt, out_dir: OutOpt,
                    channel: ChannelOpt = None, rejects: RejectsOpt = None) -> None:
    """bucket_duration_bins, bucket_batch_size, max_tps (bucketing.yaml) and NeMo JSONL manifests
    (a blend, or loose and tarred rows mixed: an input_cfg.yaml NeMo reads)."""
    from dataprep.integrations.export import export_nemo

    refuse_same_paths({"PLAN_OR_BUCKETS": plan_or_buckets, "--manifest": manifest}, {"-o": out_dir, "--rejects": rejects},
                      folders=("-o",))
    cfg = export_nemo(plan_or_buckets, manifest, out_dir, channel=channel, rejects=rejects)
    out.print(f"{plural(cfg['num_buckets'], 'bucket')} -> {out_dir / 'bucketing.yaml'}, {', '.join(cfg['written'])}")


@export_app.command("lhotse")
@user_errors
def export_lhotse_cmd(plan_or_buckets: PlanOrBuckets, manifest: ManifestOpt, out_dir: OutOpt,
                      channel: ChannelOpt = None, rejects: RejectsOpt = None) -> None:
    """A Lhotse CutSet (cuts.jsonl.gz; a Shar set for rows held in containers) and the bins / batch sizes
    for DynamicBucketingSampler (bins.json)."""
    from dataprep.integrations.export import export_lhotse

    refuse_same_paths({"PLAN_OR_BUCKETS": plan_or_buckets, "--manifest": manifest}, {"-o": out_dir, "--rejects": rejects},
                      folders=("-o",))
    bins = export_lhotse(plan_or_buckets, manifest, out_dir, channel=channel, rejects=rejects)
    out.print(f"{plural(bins['num_cuts'], 'cut')} -> {out_dir}/ ({', '.join(bins['written'])}); "
              f"{plural(len(bins['duration_bins']), 'bin')} -> {out_dir / 'bins.json'}")


@app.command("pack")
@user_errors
def pack_cmd(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest whose audio to pack.", show_default=False)],
    out_dir: OutOpt,
    layout: Annotated[str, typer.Option(help="nemo-tarred, shar or webdataset.")] = "webdataset",
    container_size: Annotated[Optional[str], typer.Option("--container-size", help="About this many bytes per container (e.g. 1GiB, 500MB). Default: 1GiB.", show_default=False)] = None,
    num_parts: Annotated[Optional[int], typer.Option("--num-parts", help="Exactly this many parts, one container each (overrides --container-size).", show_default=False)] = None,
    part_index: Annotated[Optional[int], typer.Option("--part-index", help="Write only this part (0-based; one task of an array); default: every part not yet done.", show_default=False)] = None,
    shard_size: Annotated[Optional[str], typer.Option("--shard-size", hidden=True, help="Old name of --container-size.", show_default=False)] = None,
    num_shards: Annotated[Optional[int], typer.Option("--num-shards", hidden=True, help="Old name of --num-parts.", show_default=False)] = None,
    shard_index: Annotated[Optional[int], typer.Option("--shard-index", hidden=True, help="Old name of --part-index.", show_default=False)] = None,
    buckets: Annotated[Optional[Path], typer.Option("--buckets", "-b", help="buckets.json: members ordered by bucket first (else by duration and tokens).", show_default=False)] = None,
) -> None:
    """Write the manifest's audio into tar containers NeMo, Lhotse or WebDataset read, with each layout's
    manifest (compile-ready). Atomic per container; finished ones are skipped (resumable)."""
    from dataprep.integrations.pack import pack
    from manifests.units import parse_bytes

    size = alias("--container-size", container_size, "--shard-size", shard_size) or "1GiB"
    refuse_same_paths({"MANIFEST": manifest, "--buckets": buckets}, {"-o": out_dir})
    with option_flags():
        result = pack(manifest, out_dir, layout, container_size=parse_bytes(size, flag="--container-size"),
                      num_parts=alias("--num-parts", num_parts, "--num-shards", num_shards),
                      part_index=alias("--part-index", part_index, "--shard-index", shard_index), buckets=buckets)
    out.print(f"{layout}: {plural(len(result.written), 'container')} written, {len(result.skipped)} already done, "
              f"of {result.num_parts} -> {out_dir}/")
    if result.rejected:
        from dataprep.integrations.pack import rejects_path

        out.print(f"{plural(result.rejected, 'row')} not packed (audio changed since compile) -> {rejects_path(out_dir)}")
    out.print(f"compile it with: {result.compile_hint}")
