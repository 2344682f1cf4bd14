"""PNG plots of a compiled manifest (``dataprep stats --plots DIR``).

matplotlib (the ``plots`` extra) is imported lazily, and only its object API with the Agg
canvas is used: no pyplot, no global backend switch, no display needed. Each PNG is written
atomically. Files written:

- ``duration_hist.png``: histogram of durations (s), log count axis.
- ``tps_by_duration.png``: box plot of TPS per duration bin (the paper's Figure 3 view);
  boxes are p25..p75, whiskers p5..p95, computed by polars (fine for tens of millions of rows).
- ``tokens_vs_duration.png``: hexbin of num_tokens against duration, log colour scale,
  with reference lines at 10 and 25 tokens/s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from dataprep.report.stats import DURATION_BIN_EDGES, bin_labels, duration_bin_index
from manifests.errors import DataprepError
from manifests.io import atomic_path

PLOT_FILES: tuple[str, ...] = ("duration_hist.png", "tps_by_duration.png", "tokens_vs_duration.png")

_DPI = 110


def _matplotlib() -> tuple[Any, Any]:
    """``(Figure, FigureCanvasAgg)``, or a one-line error naming the extra to install."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise DataprepError(
            "--plots needs matplotlib, which is not installed: install the plots extra "
            "(pip install 'speech-dataprep[plots]')"
        ) from None
    return Figure, FigureCanvasAgg


def _save(fig: Any, canvas_cls: Any, path: Path) -> None:
    canvas_cls(fig)
    with atomic_path(path) as tmp:
        # No "Software" stamp: equal input gives equal bytes.
        fig.savefig(tmp, format="png", dpi=_DPI, metadata={"Software": None})


def _finite(df: pl.DataFrame, *cols: str) -> pl.DataFrame:
    sel = df.select([pl.col(c).cast(pl.Float64) for c in cols])
    return sel.filter(pl.all_horizontal([pl.col(c).is_finite() for c in cols]))


def write_plots(
    df: pl.DataFrame,
    out_dir: str | os.PathLike[str],
    edges: Sequence[float] = DURATION_BIN_EDGES,
) -> list[Path]:
    """Write the three PNGs of :data:`PLOT_FILES` into ``out_dir``; return their paths.

    ``df`` needs ``duration`` (s), ``num_tokens`` and ``tps`` (tokens/s); rows with a null
    or non-finite value are left out of the plots that use that column.
    """
    Figure, Canvas = _matplotlib()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataprepError(f"{out}: --plots expects a folder, and this is a file")
    paths = [out / name for name in PLOT_FILES]
    n_total = df.height

    # 1. Duration histogram.
    dur = _finite(df, "duration")["duration"].to_numpy()
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    if dur.size:
        hi = float(dur.max()) if dur.max() > 0 else 1.0
        ax.hist(dur, bins=100, range=(0.0, hi), color="#3b75af")
        ax.set_yscale("log")
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("utterances (log)")
    ax.set_title(f"Duration histogram ({n_total:,} utterances, {float(dur.sum()) / 3600:.1f} h)")
    fig.tight_layout()
    _save(fig, Canvas, paths[0])

    # 2. TPS by duration bin, from per-bin quantiles (bxp takes precomputed stats).
    dt = _finite(df, "duration", "tps")
    labels = bin_labels(edges)
    box_stats = []
    if dt.height:
        idx = duration_bin_index(dt["duration"].to_numpy(), edges)
        q = (
            dt.with_columns(pl.Series("bin", idx))
            .group_by("bin")
            .agg(
                pl.len().alias("n"),
                *[
                    pl.col("tps").quantile(p, interpolation="linear").alias(f"q{int(p * 100)}")
                    for p in (0.05, 0.25, 0.5, 0.75, 0.95)
                ],
            )
            .sort("bin")
            .to_dicts()
        )
        for r in q:
            box_stats.append(
                {
                    "label": f"{labels[r['bin']]}\nn={r['n']:,}",
                    "whislo": r["q5"], "q1": r["q25"], "med": r["q50"], "q3": r["q75"], "whishi": r["q95"],
                    "fliers": np.empty(0),
                }
            )
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    if box_stats:
        ax.bxp(box_stats, showfliers=False)
    ax.set_xlabel("duration bin (s)")
    ax.set_ylabel("tokens per second")
    ax.set_title("TPS by duration (box p25-p75, whiskers p5-p95)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, Canvas, paths[1])

    # 3. Tokens vs duration hexbin.
    tk = _finite(df, "duration", "num_tokens")
    fig = Figure(figsize=(7, 5))
    ax = fig.add_subplot()
    if tk.height:
        d = tk["duration"].to_numpy()
        t = tk["num_tokens"].to_numpy()
        hb = ax.hexbin(d, t, gridsize=60, bins="log", mincnt=1, cmap="viridis")
        fig.colorbar(hb, ax=ax, label="utterances (log)")
        x = np.array([0.0, float(d.max())])
        for rate, style in ((25.0, "--"), (10.0, ":")):
            ax.plot(x, rate * x, style, color="#d62728", linewidth=1, label=f"{rate:g} tokens/s")
        ax.set_ylim(0, float(t.max()) * 1.05 + 1)
        ax.legend(loc="upper left")
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("num_tokens (incl. prompt)")
    ax.set_title("Tokens vs duration")
    fig.tight_layout()
    _save(fig, Canvas, paths[2])
    return paths


PADDING_PLOT_FILES: tuple[str, ...] = ("grid.png", "schemes.png", "rates.png")


def write_padding_plots(report: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Pictures of a padding report (``dataprep padding --plots DIR``).

    ``grid.png``: utterances, hours, audio and token padding per bucket as heatmaps over
    duration bin × token sub-bin; ``schemes.png``: audio and token padding (%) per scheme;
    ``rates.png`` (with dynamic resolution): frame rate against duration, a sample of the
    utterances at the report's target and the rate of a batch's longest utterance at each
    constant target F (clamped to the rates, the base rate below the floor).
    """
    Figure, canvas = _matplotlib()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pb = report["per_bucket"]
    nd = max(b["duration_bin"] for b in pb) + 1
    ns = max(b["token_bin"] for b in pb) + 1
    fig = Figure(figsize=(16, max(4, nd * 0.22)), layout="constrained")
    axes = fig.subplots(1, 4, sharey=True)
    for ax, key, title in zip(axes, ("num_rows", "hours", "audio_padding", "token_padding"),
                              ("utterances", "hours", "audio padding", "token padding")):
        grid = np.full((nd, ns), np.nan)
        for b in pb:  # one cell per bucket, not per utterance
            grid[b["duration_bin"], b["token_bin"]] = b[key]
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis")
        ax.set_title(title)
        ax.set_xlabel("token sub-bin")
        ax.set_xticks(range(ns))
        fig.colorbar(im, ax=ax)
    axes[0].set_ylabel("duration bin")
    _save(fig, canvas, out / "grid.png")

    names = list(report["schemes"])
    x = np.arange(len(names))
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    ax.bar(x - 0.2, [report["schemes"][k]["audio_padding"] * 100 for k in names], 0.4, label="audio")
    ax.bar(x + 0.2, [report["schemes"][k]["token_padding"] * 100 for k in names], 0.4, label="tokens")
    ax.set_xticks(x, names)
    ax.set_ylabel("padding (%)")
    ax.legend()
    _save(fig, canvas, out / "schemes.png")
    written = [out / "grid.png", out / "schemes.png"]
    rv = report["schemes"].get("2d-dynamic-resolution", {}).get("rate_vs_duration")
    if rv:
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        ax = fig.subplots()
        ax.scatter(rv["duration"], rv["rate"], s=3, alpha=0.4, color="grey",
                   label=f"utterances (target {report['schemes']['2d-dynamic-resolution']['config']['target_frames']})")
        for t, rates in rv["curves"].items():
            ax.plot(rv["grid"], rates, label=f"F = {t}: longest of a batch")
        ax.set_xlabel("duration (s)")
        ax.set_ylabel("frame rate (Hz)")
        ax.set_title("Dynamic resolution: frame rate vs duration")
        ax.legend(fontsize=8)
        _save(fig, canvas, out / "rates.png")
        written.append(out / "rates.png")
    return written
