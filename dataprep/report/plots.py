"""PNG plots of a compiled manifest (``dataprep stats --plots DIR``).

matplotlib (the ``plots`` extra) is imported lazily, and only its object API with the Agg
canvas is used: no pyplot, no global backend switch, no display needed. Each PNG is written
atomically. Files written:

- ``duration_hist.png``: histogram of durations (s), log count axis.
- ``tps_by_duration.png``: box plot of TPS per duration bin (the paper's Figure 3 view);
  boxes are p25..p75, whiskers p5..p95 (exact order statistics, as polars computes them).
- ``tokens_vs_duration.png``: hexbin of num_tokens against duration, log colour scale,
  with reference lines at 10 and 25 tokens/s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from dataprep.analysis.exact import SELECT_BUDGET, ExactSums, OrderSelector, polars_quantile, polars_ranks
from dataprep.analysis.stats import DURATION_BIN_EDGES, Block, bin_labels, stream_stats
from manifests.atomic_files import atomic_path
from manifests.errors import DataprepError
from manifests.optional import require

PLOT_FILES: tuple[str, ...] = ("duration_hist.png", "tps_by_duration.png", "tokens_vs_duration.png")

_DPI = 110


def _matplotlib() -> tuple[Any, Any]:
    """``(Figure, FigureCanvasAgg)``, or a one-line error naming the extra to install."""
    canvas = require("matplotlib.backends.backend_agg", "--plots").FigureCanvasAgg
    return require("matplotlib.figure", "--plots").Figure, canvas


def _save(fig: Any, canvas_cls: Any, path: Path) -> None:
    canvas_cls(fig)
    with atomic_path(path) as tmp:
        # No "Software" stamp: equal input gives equal bytes.
        fig.savefig(tmp, format="png", dpi=_DPI, metadata={"Software": None})


#: bins of the duration histogram, hexagons across the tokens-vs-duration plot
DURATION_BINS = 100
HEX_GRIDSIZE = 60
#: the TPS quantiles of each box: whiskers p5 / p95, box p25 / p75, median
BOX_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


class PlotAggregates:
    """What the three PNGs draw, gathered over the passes of :func:`~dataprep.analysis.stats.stream_stats`
    (a block consumer): counts per histogram bin and per hexagon, the box plot's TPS quantiles
    per duration bin (exact order statistics), extents and totals. Never a whole column, so
    the plots of any corpus need memory bounded by the bins; the PNGs equal those drawn
    from the whole columns (same bins, same hexagons, same figures).

    Populations: the histogram takes finite durations; the boxes rows with a finite duration
    and TPS; the hexbin rows with a finite duration and token count."""

    def __init__(self, edges: Sequence[float] = DURATION_BIN_EDGES, budget: int = SELECT_BUDGET) -> None:
        _matplotlib()  # the one-line error before any pass, not after
        self.edges = tuple(edges)
        self.rows = 0
        self.seconds = ExactSums()  # finite durations
        self.dur_max = -math.inf
        self.box = OrderSelector(budget)
        self.ext = [math.inf, -math.inf, math.inf, -math.inf]  # duration min, max; tokens min, max
        self.hist: npt.NDArray[np.int64] | None = None
        self.hex: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None
        self.grid: tuple[float, float, float, float] | None = None  # hexbin extent (after _nonsingular)
        self._counted = False

    @property
    def pending(self) -> bool:
        return self.box.pending or not self._counted

    def add(self, b: Block, pass_no: int) -> None:
        d, t, tps = b.duration, b.num_tokens, b.tps
        fin_d = np.isfinite(d)
        both = fin_d & np.isfinite(tps)
        self.box.add_keys(b.keys("tps")[both], b.duration_bins(self.edges)[both])
        pair = fin_d & np.isfinite(t)
        if pass_no == 0:
            self.rows += b.height
            self.seconds.add(d[fin_d])
            if fin_d.any():
                self.dur_max = max(self.dur_max, float(d[fin_d].max()))
            if pair.any():
                dp, tp = d[pair], t[pair]
                self.ext = [min(self.ext[0], float(dp.min())), max(self.ext[1], float(dp.max())),
                            min(self.ext[2], float(tp.min())), max(self.ext[3], float(tp.max()))]
        elif pass_no == 1:
            if self.hist is not None:
                self.hist += np.histogram(d[fin_d], bins=DURATION_BINS, range=(0.0, self._hist_top()))[0]
            if self.hex is not None and self.grid is not None:
                c1, c2 = hex_counts(d[pair], t[pair], self.grid)
                self.hex[0][:] += c1
                self.hex[1][:] += c2

    def _hist_top(self) -> float:
        return self.dur_max if self.dur_max > 0 else 1.0

    def end_pass(self, pass_no: int) -> None:
        self.box.end_pass()
        if pass_no == 0:
            counts = self.box.counts()
            self.box.request({g: [r for q in BOX_QUANTILES for r in polars_ranks(int(counts[g]), 0, q)[:2]]
                              for g in range(counts.shape[0]) if counts[g]})
            if math.isfinite(self.dur_max):
                self.hist = np.zeros(DURATION_BINS, np.int64)
            if self.ext[0] <= self.ext[1]:
                from matplotlib import transforms  # as hexbin widens a singular extent

                xmin, xmax = transforms.nonsingular(self.ext[0], self.ext[1], expander=0.1)
                ymin, ymax = transforms.nonsingular(self.ext[2], self.ext[3], expander=0.1)
                self.grid = (float(xmin), float(xmax), float(ymin), float(ymax))
                nx, ny = _hex_shape()
                self.hex = (np.zeros((nx + 1) * (ny + 1), np.int64), np.zeros(nx * ny, np.int64))
        elif pass_no == 1:
            self._counted = True

    def box_stats(self) -> list[dict[str, Any]]:
        """matplotlib ``bxp`` stats per duration bin holding rows (p5, p25, median, p75, p95)."""
        labels = bin_labels(self.edges)
        counts = self.box.counts()
        out = []
        for g in range(counts.shape[0]):
            n = int(counts[g])
            if not n:
                continue
            q = []
            for p in BOX_QUANTILES:
                r = polars_ranks(n, 0, p)
                q.append(polars_quantile(self.box.value(g, r[0]), self.box.value(g, r[1]), r))
            out.append({"label": f"{labels[g]}\nn={n:,}", "whislo": q[0], "q1": q[1], "med": q[2], "q3": q[3],
                        "whishi": q[4], "fliers": np.empty(0)})
        return out


def _hex_shape() -> tuple[int, int]:
    """(nx, ny) of matplotlib's hexbin grid for :data:`HEX_GRIDSIZE`."""
    return HEX_GRIDSIZE, int(HEX_GRIDSIZE / math.sqrt(3))


def hex_counts(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64],
               extent: tuple[float, float, float, float]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Points per hexagon of the two lattices of matplotlib's ``hexbin`` over ``extent``
    (its own arithmetic, so each point lands in the hexagon hexbin would put it in)."""
    nx, ny = _hex_shape()
    nx1, ny1 = nx + 1, ny + 1
    xmin, xmax, ymin, ymax = extent
    padding = 1.e-9 * (xmax - xmin)
    xmin -= padding
    xmax += padding
    sx = (xmax - xmin) / nx
    sy = (ymax - ymin) / ny
    ix = (x - xmin) / sx
    iy = (y - ymin) / sy
    ix1 = np.round(ix).astype(int)
    iy1 = np.round(iy).astype(int)
    ix2 = np.floor(ix).astype(int)
    iy2 = np.floor(iy).astype(int)
    i1 = np.where((0 <= ix1) & (ix1 < nx1) & (0 <= iy1) & (iy1 < ny1), ix1 * ny1 + iy1 + 1, 0)
    i2 = np.where((0 <= ix2) & (ix2 < nx) & (0 <= iy2) & (iy2 < ny), ix2 * ny + iy2 + 1, 0)
    d1 = (ix - ix1) ** 2 + 3.0 * (iy - iy1) ** 2
    d2 = (ix - ix2 - 0.5) ** 2 + 3.0 * (iy - iy2 - 0.5) ** 2
    bdist = d1 < d2
    return (np.bincount(i1[bdist], minlength=1 + nx1 * ny1)[1:],
            np.bincount(i2[~bdist], minlength=1 + nx * ny)[1:])


def _hex_centres(agg: PlotAggregates) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64],
                                                npt.NDArray[np.float64]]:
    """Centre (x, y) and count of every non-empty hexagon (hexbin maps each centre back to it)."""
    assert agg.grid is not None and agg.hex is not None
    nx, ny = _hex_shape()
    nx1, ny1 = nx + 1, ny + 1
    xmin, xmax, ymin, ymax = agg.grid
    padding = 1.e-9 * (xmax - xmin)
    xmin -= padding
    xmax += padding
    sx, sy = (xmax - xmin) / nx, (ymax - ymin) / ny
    i = np.arange(nx1 * ny1)
    j = np.arange(nx * ny)
    cx = np.concatenate([(i // ny1) * sx + xmin, (j // ny + 0.5) * sx + xmin])
    cy = np.concatenate([(i % ny1) * sy + ymin, (j % ny + 0.5) * sy + ymin])
    c = np.concatenate(agg.hex).astype(np.float64)
    keep = c > 0
    return cx[keep], cy[keep], c[keep]


def plot_aggregates(df: pl.DataFrame, edges: Sequence[float] = DURATION_BIN_EDGES) -> PlotAggregates:
    """The :class:`PlotAggregates` of one frame (``duration`` (s), ``num_tokens``, ``tps``)."""
    agg = PlotAggregates(edges)
    stream_stats(lambda: [df], edges, consumers=[agg])
    return agg


def write_plots(agg: PlotAggregates, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the three PNGs of :data:`PLOT_FILES` into ``out_dir``; return their paths.

    ``agg``: the aggregates gathered while streaming the manifest (:func:`plot_aggregates`
    for a frame); rows with a null or non-finite value are left out of the plots that use
    that column.
    """
    Figure, Canvas = _matplotlib()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataprepError(f"{out}: --plots expects a folder, and this is a file")
    paths = [out / name for name in PLOT_FILES]

    # 1. Duration histogram.
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    if agg.hist is not None:
        edges = np.histogram_bin_edges(np.empty(0), bins=DURATION_BINS, range=(0.0, agg._hist_top()))
        ax.hist(edges[:-1], bins=edges, weights=agg.hist.astype(np.float64), color="#3b75af")
        ax.set_yscale("log")
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("utterances (log)")
    ax.set_title(f"Duration histogram ({agg.rows:,} utterances, "
                 f"{agg.seconds.total(finite_only=True) / 3600:.1f} h)")
    fig.tight_layout()
    _save(fig, Canvas, paths[0])

    # 2. TPS by duration bin, from per-bin quantiles (bxp takes precomputed stats).
    box_stats = agg.box_stats()
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

    # 3. Tokens vs duration hexbin, drawn from the counts per hexagon over the same grid.
    fig = Figure(figsize=(7, 5))
    ax = fig.add_subplot()
    if agg.grid is not None:
        cx, cy, c = _hex_centres(agg)
        hb = ax.hexbin(cx, cy, C=c, reduce_C_function=np.sum, gridsize=HEX_GRIDSIZE, bins="log", mincnt=1,
                       cmap="viridis", extent=agg.grid)
        fig.colorbar(hb, ax=ax, label="utterances (log)")
        x = np.array([0.0, agg.ext[1]])
        for rate, style in ((25.0, "--"), (10.0, ":")):
            ax.plot(x, rate * x, style, color="#d62728", linewidth=1, label=f"{rate:g} tokens/s")
        ax.set_ylim(0, agg.ext[3] * 1.05 + 1)
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
