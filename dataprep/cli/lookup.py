"""Command: lookup (trace a plan step to its utterances). The work is in
:mod:`dataprep.integrations.lookup`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from dataprep.cli.app import app, option_flags, out, user_errors
from dataprep.cli.fmt import Table, plural


@app.command("lookup")
@user_errors
def lookup_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory written by plan-batches or replan.")],
    step: Annotated[int, typer.Option("--step", "-s", help="Global step to trace (0-based, as the trainer counts).")],
    rank: Annotated[Optional[int], typer.Option("--rank", "-r", help="Only this rank's batch (default: every rank's).")] = None,
    manifest: Annotated[Optional[Path], typer.Option("--manifest", "-m", help="The plan's manifest, if not next to the plan directory under its recorded name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines (one object per rank's batch, transcripts included) instead of tables.")] = False,
) -> None:
    """Print the utterances a step trains on, per rank: id, corpus, duration, tokens and where
    the audio is (file and offset, or container). Seeks to the step (one row group per shard,
    the manifest's rows memory-mapped), so it answers at once on any plan size: the tool for
    tracing a loss spike or a crash at step S back to its data."""
    from dataprep.integrations.lookup import lookup_step

    with option_flags({"step": "--step", "rank": "--rank"}):
        batches = lookup_step(plan_dir, step, None if rank is None else [rank], manifest)
    if as_json:  # JSON lines: one rank's batch per line
        for b in batches:
            typer.echo(json.dumps(b.to_json(), ensure_ascii=False))
        return
    for b in batches:
        table = Table(title=f"step {b.step}, rank {b.rank}: epoch {b.epoch} (step {b.step_in_epoch} of the epoch), "
                            f"bucket {b.bucket}, {plural(len(b.utterances), 'utterance')}, "
                            f"{b.audio_seconds:.1f} s of audio", title_justify="left")
        corpora = any(u["corpus"] for u in b.utterances)
        for name in ("#", "id", *(["corpus"] if corpora else []), "duration (s)", "tokens", "audio"):
            table.add_column(name, justify="right" if name in ("#", "duration (s)", "tokens") else "left")
        for i, u in enumerate(b.utterances):
            table.add_row(str(i), Text(str(u["id"])), *([Text(u["corpus"] or "-")] if corpora else []),
                          f"{u['duration']:.2f}", str(u["num_tokens"]), Text(_where(u)))
        out.print(table)


def _where(u: dict[str, object]) -> str:
    """Where an utterance's audio is: ``container :: member`` or ``file @ offset s``."""
    if u.get("container"):
        return f"{u['container']} :: {u['audio_path']}"
    offset = u.get("offset")
    return f"{u['audio_path']} @ {offset:.2f} s" if isinstance(offset, (int, float)) and offset else str(u["audio_path"])
