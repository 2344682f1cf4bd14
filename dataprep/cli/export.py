"""Commands: ``export nemo`` and ``export lhotse`` (buckets, batch sizes and manifests for
NeMo or Lhotse training)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dataprep.cli.app import app, out, user_errors

export_app = typer.Typer(name="export", help="Export buckets, batch sizes and manifests for NeMo or Lhotse.",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(export_app, name="export")

PlanOrBuckets = Annotated[Path, typer.Argument(help="Plan directory (plan-batches) or buckets.json.")]
ManifestOpt = Annotated[Path, typer.Option("--manifest", "-m", help="The compiled manifest the buckets / plan were made from.")]
OutOpt = Annotated[Path, typer.Option("-o", "--output", help="Output folder.")]


@export_app.command("nemo")
@user_errors
def export_nemo_cmd(plan_or_buckets: PlanOrBuckets, manifest: ManifestOpt, out_dir: OutOpt) -> None:
    """bucket_duration_bins, bucket_batch_size, max_tps (bucketing.yaml) and NeMo JSONL manifests."""
    from dataprep.integrations.export import export_nemo

    cfg = export_nemo(plan_or_buckets, manifest, out_dir)
    out.print(f"{cfg['num_buckets']} buckets -> {out_dir / 'bucketing.yaml'}, manifest.jsonl, bucket-*.jsonl")


@export_app.command("lhotse")
@user_errors
def export_lhotse_cmd(plan_or_buckets: PlanOrBuckets, manifest: ManifestOpt, out_dir: OutOpt) -> None:
    """A Lhotse CutSet (cuts.jsonl.gz) and the bins / batch sizes for DynamicBucketingSampler (bins.json)."""
    from dataprep.integrations.export import export_lhotse

    bins = export_lhotse(plan_or_buckets, manifest, out_dir)
    out.print(f"{bins['num_cuts']} cuts -> {out_dir / 'cuts.jsonl.gz'}; {len(bins['duration_bins'])} bins -> {out_dir / 'bins.json'}")
