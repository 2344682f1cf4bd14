"""Commands: ``stats`` (tables, ``--json``, ``--plots``) and ``filter`` (kept + rejects).

Thin layer: parse options, call :func:`dataprep.analysis.stats_report` /
:func:`dataprep.analysis.filter_manifest`, print rich tables on stdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dataprep.cli.app import app, build_options, err, out, user_errors
from dataprep.cli.fmt import Table
from dataprep.analysis import FilterSummary, ManifestStats, Thresholds, filter_manifest, stats_report
from dataprep.analysis.blend_tree import blend_lines
from bucketing.token_equivalents import TokenEquivalentOptions
from manifests.manifest_write import default_rejects_path


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def stats_tables(s: ManifestStats) -> list[Table]:
    """The rich tables ``dataprep stats`` prints."""
    totals = Table(title="Totals", title_justify="left")
    totals.add_column("utterances", justify="right")
    totals.add_column("hours", justify="right")
    totals.add_row(f"{s.utterances:,}", _f(s.hours))

    langs = Table(title="Per language", title_justify="left")
    for name in ("lang", "utterances", "hours", "median TPS"):
        langs.add_column(name, justify="left" if name == "lang" else "right")
    for ls in s.languages:
        langs.add_row(ls.lang, f"{ls.utterances:,}", _f(ls.hours), _f(ls.median_tps))

    quant = Table(title="Quantiles", title_justify="left")
    quant.add_column("column")
    levels = list(next(iter(s.quantiles.values())).keys()) if s.quantiles else []
    for lv in levels:
        quant.add_column(lv, justify="right")
    units = {"duration": "duration (s)", "num_tokens": "num_tokens", "tps": "tps (tokens/s)"}
    for col, qs in s.quantiles.items():
        quant.add_row(units.get(col, col), *[_f(qs[lv], 0 if col == "num_tokens" else 2) for lv in levels])

    bins = Table(title="TPS by duration (tokens/s)", title_justify="left")
    for name in ("duration (s)", "utterances", "hours", "TPS p10", "TPS median", "TPS p90"):
        bins.add_column(name, justify="left" if name == "duration (s)" else "right")
    for b in s.tps_by_duration:
        bins.add_row(b.label, f"{b.count:,}", _f(b.hours), _f(b.tps_p10), _f(b.tps_median), _f(b.tps_p90))

    tables = []
    if s.corpora:
        corp = Table(title="Per corpus", title_justify="left")
        for name in ("corpus", "utterances", "hours", "tokens"):
            corp.add_column(name, justify="left" if name == "corpus" else "right")
        for c in s.corpora:
            corp.add_row(c.corpus, f"{c.utterances:,}", _f(c.hours), f"{c.tokens:,}")
        tables.append(corp)

    if s.modalities:
        mods = Table(title="Per modality (text rows: no audio, duration 0, no TPS)", title_justify="left")
        for name in ("modality", "utterances", "hours", "tokens"):
            mods.add_column(name, justify="left" if name == "modality" else "right")
        for name, m in s.modalities.items():
            mods.add_row(name, f"{int(m['utterances']):,}", _f(m["hours"]), f"{int(m['tokens']):,}")
        tables.append(mods)
    if s.token_equivalents:
        te = s.token_equivalents
        tet = Table(title=f"Token-equivalents (ceil(duration x {te['audio_token_rate']:g}/s) + num_tokens)",
                    title_justify="left")
        for name in ("total", "audio rows", "text rows", *te["quantiles"]):
            tet.add_column(name, justify="right")
        tet.add_row(f"{te['total']:,}", f"{te['audio']:,}", f"{te['text']:,}",
                    *[_f(v, 0) for v in te["quantiles"].values()])
        tables.append(tet)

    th = Table(title="Outliers at common thresholds", title_justify="left")
    th.add_column("condition")
    th.add_column("utterances", justify="right")
    th.add_column("share", justify="right")
    for t in s.thresholds:
        th.add_row(t.name, f"{t.count:,}", f"{100 * t.fraction:.2f}%")
    return [totals, langs, *tables, quant, bins, th]


@app.command("stats")
@user_errors
def stats_command(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest (Parquet) from `dataprep compile`.")],
    json_path: Annotated[
        Optional[Path],
        typer.Option("--json", help="Also write the figures as JSON (sorted keys, floats rounded to 4 places)."),
    ] = None,
    plots: Annotated[
        Optional[Path],
        typer.Option(
            "--plots",
            help="Folder for PNGs: duration_hist.png, tps_by_duration.png, tokens_vs_duration.png "
            "(needs the plots extra: matplotlib).",
        ),
    ] = None,
    audio_token_rate: Annotated[
        Optional[float],
        typer.Option("--audio-token-rate", help="Also report token-equivalents: ceil(duration x RATE) + num_tokens "
                     "per row (RATE: tokens per second of audio, 1 / NeMo's token_equivalent_duration; 12.5 for "
                     "80 ms encoder frames).", show_default=False),
    ] = None,
) -> None:
    """Totals, per language, quantiles of duration / tokens / TPS, TPS by duration bin and
    outlier counts (TPS > 25, duration > 40 s, < 0.5 s), as tables on stdout."""
    agg = None
    if plots is not None:
        from dataprep.report.plots import PlotAggregates  # lazy: matplotlib is an extra

        agg = PlotAggregates()
    token_options = None if audio_token_rate is None else build_options(
        TokenEquivalentOptions, {}, audio_token_rate=audio_token_rate)
    stats, written = stats_report(manifest, json_path, consumers=[agg] if agg is not None else [],
                                  token_options=token_options)
    if agg is not None and plots is not None:
        from dataprep.report.plots import write_plots

        written += [Path(p) for p in write_plots(agg, plots)]
    for table in stats_tables(stats):
        out.print(table)
    for line in blend_lines(manifest, stats.corpora):
        out.print(line)
    for path in written:
        err.print(f"wrote {path}")

def filter_table(r: FilterSummary) -> Table:
    """Per-filter counts: rows failing each filter, and rows rejected with it as the reason."""
    t = Table(title="Filters (reason = first failing filter, in this order)", title_justify="left")
    for name in ("filter", "rule", "failing", "rejected (reason)"):
        t.add_column(name, justify="left" if name in ("filter", "rule") else "right")
    for c in r.counts:
        keep_op = "<=" if c.op == ">" else ">="
        t.add_row(c.name, f"keep {c.column} {keep_op} {c.value:g}", f"{c.failed:,}", f"{c.rejected:,}")
    return t


@app.command("filter")
@user_errors
def filter_cmd(
    manifest: Annotated[Path, typer.Argument(help="Compiled manifest (Parquet) to filter.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Kept rows, as a compiled manifest (Parquet).")],
    rejects: Annotated[
        Optional[Path],
        typer.Option(
            "--rejects",
            help="Rejected rows with `reason` and `detail` (Parquet). Default: <output stem>.rejects.parquet next to -o.",
        ),
    ] = None,
    max_tps: Annotated[
        Optional[float],
        typer.Option(
            "--max-tps",
            help="Reject rows with tps > this (tokens/s). The paper's choice is 25; not applied unless given.",
        ),
    ] = None,
    min_tps: Annotated[Optional[float], typer.Option("--min-tps", help="Reject rows with tps < this (tokens/s).")] = None,
    min_duration: Annotated[
        Optional[float], typer.Option("--min-duration", help="Reject rows shorter than this (seconds).")
    ] = None,
    max_duration: Annotated[
        Optional[float], typer.Option("--max-duration", help="Reject rows longer than this (seconds).")
    ] = None,
    min_tokens: Annotated[
        Optional[int], typer.Option("--min-tokens", help="Reject rows with fewer tokens (incl. prompt).")
    ] = None,
    max_tokens: Annotated[
        Optional[int], typer.Option("--max-tokens", help="Reject rows with more tokens (incl. prompt).")
    ] = None,
) -> None:
    """Drop outliers by TPS, duration and token count. Only the filters given are applied;
    every removed row goes to the rejects file with the first filter it fails as `reason`.
    Rows in = kept + rejected, always; kept rows keep the input order."""
    thresholds = build_options(Thresholds, None, max_tps=max_tps, min_tps=min_tps, min_duration=min_duration,
                               max_duration=max_duration, min_tokens=min_tokens, max_tokens=max_tokens)
    result = filter_manifest(manifest, output, thresholds, rejects)
    if not thresholds.active():
        err.print("no filter given: every row is kept")
    if result.counts:
        out.print(filter_table(result))
    n = max(result.rows_in, 1)
    out.print(
        f"rows in {result.rows_in:,} | kept {result.kept:,} ({100 * result.kept / n:.2f}%) | "
        f"rejected {result.rejected:,} ({100 * result.rejected / n:.2f}%)"
    )
    err.print(f"wrote {output} and {rejects if rejects is not None else default_rejects_path(output)}")
