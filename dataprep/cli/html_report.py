"""Command: ``report`` — one self-contained, interactive HTML page of a manifest, its rejects,
its buckets and its plan (:mod:`dataprep.report.aggregates`, :mod:`dataprep.report.page`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dataprep.cli.app import app, err, out, parse_memory_limit, parse_world_sizes, user_errors
from dataprep.planning import DEFAULT_WORLD_SIZES
from dataprep.report.aggregates import collect_report
from dataprep.report.page import write_page
from manifests.errors import DataprepError
from manifests.outputs import refuse_same_paths


@app.command("report")
@user_errors
def report_cmd(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest (Parquet), e.g. the kept rows of `filter`.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML page to write (replaced only if this "
                                                                "command wrote it).")],
    rejects: Annotated[
        Optional[list[Path]],
        typer.Option("--rejects", help="Rejects file(s) of compile or filter (repeat the option for several)."),
    ] = None,
    buckets: Annotated[
        Optional[Path], typer.Option("--buckets", "-b", help="buckets.json (default with --plan: the plan's buckets).")
    ] = None,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Plan directory of this manifest.")] = None,
    world_sizes: Annotated[
        str, typer.Option("--world-sizes", help="World sizes simulated for the plan section, comma-separated.")
    ] = ",".join(map(str, DEFAULT_WORLD_SIZES)),
    steps: Annotated[Optional[Path], typer.Option("--steps", help="Step log of a run of --plan (as `dataprep calibrate` reads: a Parquet file or dataprep train's checkpoint folder): measured against predicted step time per bucket and per rank.", show_default=False)] = None,
    cost_model: Annotated[Optional[Path], typer.Option("--cost-model", help="costmodel.json whose predictions (and rank time factors) the --steps section shows (default: the model `dataprep calibrate` fits to the log).", show_default=False)] = None,
    memory_limit: Annotated[Optional[str], typer.Option("--memory-limit", help="Memory the report may hold, e.g. 4GiB (default: half the machine's). The manifest is read in blocks; the padding is measured as dataprep padding --memory-limit measures it; with --plan each row's corpus and duration and each epoch's planned rows are spilled next to the manifest (16 bytes per utterance) and joined in ranges of at most 8M rows, fewer when this limit is lower (the same page at any limit).", show_default=False)] = None,
) -> None:
    """Write one HTML file (scripts and data inline: opens without a network, a few MB at most
    whatever the corpus) with the corpus (totals per corpus / language / task, distributions,
    a --max-tps slider, rejects by reason), the buckets (duration x tokens with the grid, batch
    sizes and their source, padding per bucket and per scheme, empty buckets explained), the plan
    (steps, balance, ranks, a blend's target against achieved shares, simulate, and its shares
    per window with --weight-window), a run's measured against predicted step times per bucket
    and rank (--steps) and a glossary."""
    sizes = parse_world_sizes("--world-sizes", world_sizes)
    inputs = {"MANIFEST": manifest, "--buckets": buckets, "--plan": plan, "--steps": steps, "--cost-model": cost_model,
              **{f"--rejects {p}": p for p in rejects or []}}
    refuse_same_paths(inputs, {"-o": output})
    if plan is not None and output.resolve().parent == plan.resolve():
        raise DataprepError(f"{output}: -o: is inside the plan directory {plan}; write the report elsewhere")
    data = collect_report(manifest, rejects=rejects or [], buckets=buckets, plan=plan, world_sizes=sizes,
                          memory_limit=None if memory_limit is None else parse_memory_limit(memory_limit),
                          steps=steps, cost_model=cost_model)
    size = write_page(data, output)
    out.print(f"{output} ({size / 1e6:.2f} MB)")
    err.print(f"wrote {output}")
