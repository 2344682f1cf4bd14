"""Staged blends (multi-stage data balancing, e.g. Canary-1B-v2's two stages): a weighted plan
whose epochs fall into stages, each with its own corpus weights (``--stage EPOCHS:weights.yaml``,
repeated). A stage is whole epochs, so every epoch is still exactly each corpus's quota of that
stage's blend, every under-sampled corpus covering its rows before any repeat (the draws of
epoch ``e`` depend on (row, quota, seed, e) only: :class:`bucketing.quota.QuotaSampler`).
``plan.json`` records each stage's epochs, first step and weights (``stages``); ``replan``
rebuilds each stage's sampler from them, so a re-plan at a stage boundary for the same world
size gives the original's remaining plan. Every stage weighs the same corpora (weights > 0).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from bucketing.quota import QuotaError, blend_probabilities, flat_tree
from dataprep.planning.options import PlanOptions
from dataprep.planning.weights import Blend, WeightedEpochs, weighting
from manifests.errors import DataprepError, OptionError


def parse_stage(text: str) -> tuple[int, dict[str, float]]:
    """``EPOCHS:FILE`` (the CLI's ``--stage``): the stage's epochs and the weights FILE holds (a
    YAML mapping corpus -> weight > 0). Bad input: a one-line error naming the file."""
    count, sep, path = text.partition(":")
    if not sep or not count.strip().isdigit() or int(count) < 1 or not path:
        raise OptionError("stages", f"{text!r}: expected EPOCHS:weights.yaml with EPOCHS >= 1")
    try:
        obj = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataprepError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DataprepError(f"{path}: not a YAML mapping of corpus weights ({str(exc).splitlines()[0]})") from None
    if not isinstance(obj, dict) or not obj:
        raise DataprepError(f"{path}: expected a mapping corpus: weight, e.g. librispeech: 960")
    out: dict[str, float] = {}
    for name, w in obj.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not np.isfinite(w) or w <= 0:
            raise DataprepError(f"{path}: {name}: expected a weight > 0, got {w!r}")
        out[str(name)] = float(w)
    return int(count), out


@dataclass
class StagedWeights:
    """Each stage's first epoch and :class:`WeightedEpochs` (the corpora in one order)."""

    first_epoch: list[int]
    weighted: list[WeightedEpochs]

    def of(self, epoch: int) -> WeightedEpochs:
        """The weighting of ``epoch``'s stage."""
        return self.weighted[int(np.searchsorted(self.first_epoch, epoch, side="right")) - 1]

    def add_totals(self, epoch: int, totals: npt.NDArray[np.int64]) -> None:
        self.of(epoch).add_totals(totals)

    def to_json(self, first_step_of_epoch: Mapping[int, int], epochs: int) -> list[dict[str, Any]]:
        """``plan.json``'s ``stages``: per stage its epochs ``[first, last]``, its first step
        (where this plan holds it) and its weights (as ``weights``)."""
        ends = [*self.first_epoch[1:], epochs]
        return [{"epochs": [a, b - 1], "first_step": first_step_of_epoch.get(a), "weights": w.to_json()}
                for a, b, w in zip(self.first_epoch, ends, self.weighted)]


def staged_weights(manifest: str | os.PathLike[str], stages: Sequence[tuple[int, Mapping[str, float]]],
                   names: list[str], rows: npt.NDArray[np.int64], micros: npt.NDArray[np.int64],
                   options: PlanOptions) -> StagedWeights:
    """The :class:`StagedWeights` of ``stages`` over corpora ``names`` (the spill's order) of
    ``rows`` plannable rows and ``micros`` microseconds each."""
    first, out = 0, []
    starts = []
    for count, weights in stages:
        ordered = {n: float(weights[n]) for n in names}
        try:
            blend = Blend("stage", flat_tree(ordered, None), blend_probabilities(flat_tree(ordered, None)))
        except QuotaError as exc:
            raise DataprepError(f"{manifest}: stage weights: {exc}") from None
        out.append(weighting(manifest, blend, rows, micros, dataclasses.replace(options, weights=ordered)))
        starts.append(first)
        first += count
    return StagedWeights(starts, out)


def recorded_stages(recorded: object) -> list[tuple[int, dict[str, float]]] | None:
    """A plan's ``stages`` (``plan.json``) as (epochs, weights) pairs (None: not staged)."""
    if not isinstance(recorded, list) or not recorded:
        return None
    out = []
    for st in recorded:
        a, b = st["epochs"]
        children = st["weights"]["tree"].get("children") or []
        if not children or any("corpus" not in c or c.get("weight") is None for c in children):
            raise DataprepError("plan.json: stages: a stage without its weights")
        out.append((int(b) - int(a) + 1, {str(c["corpus"]): float(c["weight"]) for c in children}))
    return out
