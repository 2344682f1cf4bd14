"""The dynamic-resolution options, declared once for plan-batches, oomptimize and padding:
their defaults and their checks are :class:`~bucketing.dynres.DynResConfig`'s."""

from __future__ import annotations

from typing import Annotated

import typer

from bucketing.dynres import DynResConfig
from dataprep.cli.app import build_options, defaults_of
from manifests.options import check_needs

DYNRES_DEFAULTS = defaults_of(DynResConfig)
TargetFramesOpt = Annotated[str, typer.Option("--target-frames", help="Dynamic resolution: frames per batch, a constant F in 800..1600 (long batches get fewer frames, short ones more) or 'longest' (each batch's longest at --frames-per-second).")]
FramesPerSecondOpt = Annotated[float, typer.Option(help="Dynamic resolution: base frame rate (Hz) of the features.")]
MinRateOpt = Annotated[float, typer.Option(help="Dynamic resolution: lowest frame rate (Hz); below it the rate is clamped.")]
MaxRateOpt = Annotated[float, typer.Option(help="Dynamic resolution: highest frame rate (Hz); above it the rate is clamped and the rest zero-padded.")]
FloorRateOpt = Annotated[float, typer.Option(help="Dynamic resolution: a batch needing a rate below this (Hz) falls back to ordinary padding.")]


def dynres_config(target_frames: str, frames_per_second: float, min_rate: float, max_rate: float,
                  floor_rate: float) -> DynResConfig:
    """The options as a :class:`DynResConfig`, which checks them; its errors name the flags.
    ``--target-frames`` is ``longest`` or an integer (anything else goes to the check as given)."""
    target: int | str = int(target_frames) if target_frames.strip().lstrip("+-").isdigit() else target_frames
    return build_options(DynResConfig, None, target_frames=target, frames_per_second=frames_per_second,
                         min_rate=min_rate, max_rate=max_rate, floor_rate=floor_rate)


def refuse_unused(enabled: bool, enabling: str, target_frames: str, frames_per_second: float, min_rate: float,
                  max_rate: float, floor_rate: float) -> None:
    """A rate flag set (to other than its default) without ``enabling`` would be ignored: refused."""
    d = DYNRES_DEFAULTS
    for flag, value, default in (("--target-frames", target_frames, d.target_frames),
                                 ("--frames-per-second", frames_per_second, d.frames_per_second),
                                 ("--min-rate", min_rate, d.min_rate), ("--max-rate", max_rate, d.max_rate),
                                 ("--floor-rate", floor_rate, d.floor_rate)):
        check_needs(flag, str(value) != str(default), enabling, enabled)
