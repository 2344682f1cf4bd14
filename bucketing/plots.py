"""Pictures of the padding report: the 2D grid as heatmaps, and padding per scheme as bars.

matplotlib is imported lazily (Agg backend), so the rest of the package never needs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from manifests.io import atomic_path


def write_plots(report: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``grid.png`` (utterances, hours, audio/token padding per bucket, duration bin ×
    token sub-bin) and ``schemes.png`` (padding per scheme); return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pb = report["per_bucket"]
    nd = max(b["duration_bin"] for b in pb) + 1
    ns = max(b["token_bin"] for b in pb) + 1
    fig, axes = plt.subplots(1, 4, figsize=(16, max(4, nd * 0.22)), sharey=True)
    for ax, key, title in zip(axes, ("num_rows", "hours", "audio_padding", "token_padding"),
                              ("utterances", "hours", "audio padding", "token padding")):
        m = np.full((nd, ns), np.nan)
        for b in pb:
            m[b["duration_bin"], b["token_bin"]] = b[key]
        im = ax.imshow(m, aspect="auto", origin="lower", cmap="viridis")
        ax.set_title(title)
        ax.set_xlabel("token sub-bin")
        ax.set_xticks(range(ns))
        fig.colorbar(im, ax=ax)
    axes[0].set_ylabel("duration bin")
    paths = []
    for name, f in (("grid.png", fig),):
        with atomic_path(out / name) as tmp:
            f.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
        paths.append(out / name)
    plt.close(fig)
    names = list(report["schemes"])
    audio = [report["schemes"][k]["audio_padding"] * 100 for k in names]
    tok = [report["schemes"][k]["token_padding"] * 100 for k in names]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(names))
    ax.bar(x - 0.2, audio, 0.4, label="audio")
    ax.bar(x + 0.2, tok, 0.4, label="tokens")
    ax.set_xticks(x, names)
    ax.set_ylabel("padding (%)")
    ax.legend()
    with atomic_path(out / "schemes.png") as tmp:
        fig.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    paths.append(out / "schemes.png")
    return paths
