"""The blend tree of a many-corpora manifest, as ``dataprep stats`` prints it.

A manifest compiled from an ``input_cfg`` blend records its tree in its metadata (nodes
``{"weight", "corpus"}`` or ``{"weight", "temperature"?, "children"}``). :func:`blend_lines`
draws it one node a line, indented by depth: each corpus with its weight, NeMo's probability
(:func:`bucketing.quota.blend_probabilities`, weighted blends only) and its utterances and
hours in the manifest; each group with its weight and temperature.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from bucketing.quota import QuotaError, blend_probabilities, is_weighted
from dataprep.analysis.stats import CorpusStats
from manifests.manifest_read import read_metadata


def blend_of_manifest(manifest: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The blend a manifest records (``{"path", "tree", ...}``), or None for one corpus."""
    blend = read_metadata(manifest)["provenance"].get("blend")
    return blend if isinstance(blend, dict) and isinstance(blend.get("tree"), dict) else None


def _temp(t: Any) -> str:
    return "" if t is None else f", temperature {t if not isinstance(t, list) else ', '.join(map(str, t))}"


def blend_lines(manifest: str | os.PathLike[str], corpora: Sequence[CorpusStats] = ()) -> list[str]:
    """The blend tree of ``manifest`` as lines (empty for a manifest of one corpus)."""
    blend = blend_of_manifest(manifest)
    if blend is None:
        return []
    tree = blend["tree"]
    probs: dict[str, float] = {}
    if is_weighted(tree):
        try:
            probs = blend_probabilities(tree)
        except QuotaError:
            probs = {}
    have = {c.corpus: c for c in corpora}
    width = max([len(str(n)) for n in probs] + [len(c) for c in have] + [6])
    head = f"Blend tree ({os.path.basename(str(blend.get('path', '')))}{_temp(tree.get('temperature'))})"
    lines = [head + ("; p = NeMo's probability per corpus" if probs else "; unweighted: every row once")]

    def walk(node: Mapping[str, Any], depth: int) -> None:
        for child in node.get("children", []):
            pad = "  " * depth
            w = child.get("weight")
            weight = f"weight {w:g}" if isinstance(w, (int, float)) else "no weight"
            if "children" in child:
                t = child.get("temperature")
                lines.append(f"{pad}group  {weight}" + (f"  temperature {t}" if t is not None else ""))
                walk(child, depth + 1)
                continue
            name = str(child.get("corpus"))
            line = f"{pad}{name:<{width}}  {weight}"
            if name in probs:
                line += f"  p {probs[name]:.3f}"
            c = have.get(name)
            if c is not None:
                line += f"  {c.utterances:,} utterances, {c.hours:,.2f} h"
            lines.append(line)

    walk(tree, 1)
    return lines
