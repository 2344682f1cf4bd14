"""Section 2 of ``dataprep report``, the buckets: per bucket its bounds, rows, hours, batch
size and where it came from, padding and any OOM breakdown, and the padding of every scheme.
Rows and hours per bucket are exact (every row allocated, tails carried); the padding is
``dataprep padding``'s (:func:`dataprep.analysis.manifest_padding_report`, memory bounded by
the report's limit) of the manifest, or past :data:`SCHEME_SAMPLE_ROWS` rows of a seeded
uniform sample written as a small manifest next to it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from bucketing.dynres import DynResConfig
from bucketing.fit import grid_from_spec
from dataprep.analysis.padding import batch_sizes_for, manifest_padding_report
from dataprep.report.plan_section import _r
from dataprep.report.stream_sections import BucketRows, RowBlock
from manifests.buckets_file import BucketSpec
from manifests.manifest_write import write_manifest
from manifests.spill import remove_spill, spill_dir

#: rows the padding per scheme is measured on (a uniform sample beyond it; 1M rows keep the
#: schemes' padding within a few hundredths of a percent of the full figure and take ~4 s)
SCHEME_SAMPLE_ROWS = 1_000_000


#: N of the packed sequences the report compares with fixed and 2D batches (token-equivalents,
#: at the default audio token rate)
REPORT_PACK = 2048


@dataclass(frozen=True)
class BucketAggregates:
    """Section 2: per-bucket table (bounds, rows, hours, batch size and its source, padding,
    OOM breakdown when recorded) and the padding of every scheme."""

    file: str
    source: dict[str, Any]
    buckets: list[dict[str, Any]]
    schemes: list[dict[str, Any]]
    breakdown: list[dict[str, Any]]
    #: rows the padding was measured on, of ``rows``
    measured_rows: int
    rows: int
    #: rows carried up to a later bucket (a bucket's tail of at most half a batch); buckets
    #: holding no row (``empty``): left empty by the carry (``emptied``: every row carried on)
    #: or with no row in their range (``unfilled``)
    carried: int = 0
    empty: int = 0
    emptied: int = 0
    unfilled: int = 0
    #: fixed, 2D and packed sequences of :data:`REPORT_PACK` token-equivalents: padding in
    #: audio, tokens and token-equivalents (``dataprep padding --pack``)
    currencies: list[dict[str, Any]] = field(default_factory=list)


def batch_size_origin(source: dict[str, Any]) -> str:
    """Where a buckets.json's batch sizes came from: budget, estimate or device probe."""
    rule = str(source.get("rule", ""))
    return {"padded-budget": "budget", "oom-estimate": "estimate", "oom-measured": "device probe"}.get(
        rule, rule or "unknown")


def bucket_rows(num_rows: int, spec: BucketSpec, sample: int = SCHEME_SAMPLE_ROWS) -> BucketRows:
    """The block consumer of section 2 for a manifest of ``num_rows`` rows under ``spec``."""
    _, bs = batch_sizes_for(spec)
    return BucketRows(num_rows, grid_from_spec(spec), bs, sample)


def bucket_section(rows: BucketRows, spec: BucketSpec, manifest: str | os.PathLike[str],
                   blocks: Callable[[], Iterable[RowBlock]], *, name: str = "",
                   memory_limit: int | None = None) -> BucketAggregates:
    """Padding per scheme (fixed, 1D, 2D, dynamic resolution) and per bucket of ``manifest``
    (its rows fed to ``rows``, every block) under ``spec`` (named ``name``), as ``dataprep
    padding`` gives it at its defaults. Beyond the sample size the padding is measured on a
    uniform sample (a seeded draw, written as a manifest to a spill folder next to
    ``manifest`` and removed: padding is a ratio per batch, and a bucket's batches look alike
    at any corpus size); rows and hours per bucket are always exact (every row allocated and
    tails carried as the padding report does; ``blocks`` gives the rows again when carried
    tails need a second pass). ``memory_limit``: bytes, as ``dataprep padding``'s."""
    n = rows.num_rows
    grid = grid_from_spec(spec)
    options = {"memory_limit": memory_limit, "dynamic_resolution": DynResConfig(), "pack": REPORT_PACK}
    if rows.exact:
        if rows.carry():
            for block in blocks():
                rows.add_seconds(block)
        root = spill_dir(manifest)
        try:
            sample = root / "padding-sample.parquet"
            write_manifest(pl.DataFrame({"id": pl.int_range(rows.measured, eager=True).cast(pl.String),
                                         "duration": rows.d, "num_tokens": rows.t}), sample)
            rep = manifest_padding_report(sample, spec, name=f"{manifest} (the padding's sample)", **options)
        finally:
            remove_spill(root)
        exact_h = rows.seconds / 3600.0
        rep["per_bucket"] = [{**pb, "num_rows": int(rows.counts[i]), "hours": float(exact_h[i])}
                             for i, pb in enumerate(rep["per_bucket"])]
        carried = rows.carried
    else:  # every row measured: the padding report carried from the same allocation
        rows.carry()
        rep = manifest_padding_report(manifest, spec, **options)
        carried = int(rep["carried"])
    allocated = rows.allocated
    origin = batch_size_origin(spec.batch_size_source)
    final = np.asarray([pb["num_rows"] for pb in rep["per_bucket"]], dtype=np.int64)
    before = allocated if allocated is not None else final
    table, breakdown = [], []
    for b, pb in zip(spec.buckets, rep["per_bucket"]):
        lo = grid.min_duration[b.index]
        table.append({"bucket": b.index, "min_duration": _r(lo, 3) if np.isfinite(lo) else 0.0,
                     "max_duration": _r(b.max_duration, 3), "max_tokens": b.max_tokens,
                     "utterances": pb["num_rows"], "hours": _r(pb["hours"], 4),
                     "batch_size": b.batch_size if b.batch_size is not None else pb["batch_size"],
                     "source": origin if b.batch_size is not None else "budget (default)",
                     "peak_gib": _r(b.extra["oom_peak_bytes"] / 2**30, 2) if b.extra.get("oom_peak_bytes") else None,
                     "audio_padding": pb["audio_padding"], "token_padding": pb["token_padding"],
                     "batches": pb["num_batches"]})
        for cls, v in (b.extra.get("oom_breakdown") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                breakdown.append({"bucket": b.index, "class": str(cls), "gib": _r(v / 2**30, 3)})
    schemes = [{"scheme": k, "audio_padding": v["audio_padding"], "token_padding": v["token_padding"],
                "batches": v["num_batches"], "mean_batch": v["mean_batch_size"], "excluded": v.get("excluded", 0)}
               for k, v in rep["schemes"].items()]
    cur = rep["currencies"]
    currencies = [{"scheme": k, "audio_padding": v["audio_padding"], "token_padding": v["token_padding"],
                   "te_padding": v["te_padding"], "excluded": v["excluded"]} for k, v in cur["schemes"].items()]
    return BucketAggregates(name, dict(spec.batch_size_source), table, schemes, breakdown, rows.measured, n,
                            carried=carried, empty=int((final == 0).sum()),
                            emptied=int(((final == 0) & (before > 0)).sum()),
                            unfilled=int((before == 0).sum()), currencies=currencies)
