"""``export nemo`` of a blend (loose and tarred corpora may mix): NeMo's ``input_cfg``.

A manifest compiled from an ``input_cfg`` (``corpus`` column, blend tree in its metadata)
exports as ``input_cfg.yaml``: the recorded
tree as NeMo reads it (one top ``group``; each list's ``reweight_temperature`` and each item's
``weight`` as recorded), a dataset per corpus with ``tags: {corpus: NAME}`` and its rows in
``corpus-NNN/`` (``manifest.jsonl`` for loose files, ``manifest_<k>.json`` per tar for tar
members, ``type: nemo_tarred``). The tags that filled fields at compile are in the rows' own
fields. ``bucketing.yaml`` names ``input_cfg`` and, when loose and tarred corpora mix, sets
``force_iterable_dataset: true`` (NeMo refuses the mix otherwise). A corpus mixing both kinds,
or held in Parquet containers, is refused naming ``dataprep pack``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from dataprep.integrations.export_io import (
    Stats,
    bucketing_config,
    export_dir,
    iter_manifest,
    nemo_duration,
    pack_hint,
    row_channels,
    row_tokens,
    tar_pattern,
    write_config,
)
from manifests.errors import DataprepError
from manifests.manifest_read import read_metadata
from manifests.records import nemo_line

#: the folder of the i-th corpus (names may hold any character; the tag keeps the name)
CORPUS_DIR = "corpus-{:03d}"


def blend_tree(manifest: Path) -> dict[str, Any] | None:
    """The blend tree a manifest records with more than one corpus (None otherwise)."""
    blend = read_metadata(manifest)["provenance"].get("blend")
    tree = blend.get("tree") if isinstance(blend, dict) else None
    return tree if isinstance(tree, dict) and len(_corpora(tree)) > 1 else None


def _corpora(node: dict[str, Any]) -> list[str]:
    return [n for c in node.get("children", []) for n in (_corpora(c) if "children" in c else [str(c["corpus"])])]


def _kinds(manifest: Path) -> tuple[pa.Array, dict[str, str], dict[str, list[str]]]:
    """Each row's corpus, each corpus's kind (``nemo`` / ``nemo_tarred``) and its tars."""
    names = pq.ParquetFile(manifest).schema_arrow.names
    cols = [c for c in ("corpus", "container", "member_offset") if c in names]
    t = pq.read_table(manifest, columns=cols)
    n = t.num_rows
    held = t.column("container") if "container" in names else pa.nulls(n, pa.string())
    corpus = t.column("corpus").combine_chunks()
    import polars as pl

    df = pl.DataFrame({"corpus": corpus, "container": held,
                       "offset": t.column("member_offset") if "member_offset" in names else pa.nulls(n, pa.int64())})
    if df["corpus"].null_count():
        raise DataprepError(f"{manifest}: {df['corpus'].null_count()} row(s) name no corpus; recompile the blend")
    per = df.group_by("corpus", maintain_order=True).agg(
        pl.col("container").is_not_null().sum().alias("held"), pl.len().alias("rows"),
        (pl.col("container").is_not_null() & pl.col("offset").is_null()).sum().alias("parquet"),
        pl.col("container").drop_nulls().unique().sort().alias("tars"))
    kinds, tars = {}, {}
    for r in per.iter_rows(named=True):
        if r["parquet"]:
            raise DataprepError(f"{manifest}: corpus {r['corpus']}: rows held in Parquet files: NeMo reads tarred "
                                f"audio only; run: {pack_hint(manifest)}")
        if 0 < r["held"] < r["rows"]:
            raise DataprepError(f"{manifest}: corpus {r['corpus']}: {r['rows'] - r['held']} loose file(s) and "
                                f"{r['held']} tar member(s); NeMo reads one kind per dataset; run: {pack_hint(manifest)}")
        kinds[r["corpus"]] = "nemo_tarred" if r["held"] else "nemo"
        tars[r["corpus"]] = list(r["tars"])
    return corpus, kinds, tars


def _node(node: dict[str, Any], leaves: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A tree node's list as NeMo ``input_cfg`` items."""
    items = []
    for child in node["children"]:
        if "children" in child:
            item: dict[str, Any] = {"type": "group", "input_cfg": _node(child, leaves),
                                    "reweight_temperature": [_temp(child)]}
        else:
            item = dict(leaves[str(child["corpus"])])
        if child.get("weight") is not None:
            item["weight"] = float(child["weight"])
        items.append(item)
    return items


def _temp(node: dict[str, Any]) -> float:
    t = node.get("temperature")
    t = t[0] if isinstance(t, list) else t
    return 1.0 if t is None else float(t)


def export_nemo_blend(inputs: Any, out_dir: str | os.PathLike[str], tree: dict[str, Any],
                      channel: int | None) -> dict[str, Any]:
    """Write ``input_cfg.yaml``, ``bucketing.yaml`` and each corpus's manifests (module docstring)."""
    manifest, out = inputs.manifest_path, Path(out_dir).resolve()
    corpus, kinds, tars = _kinds(manifest)
    order = _corpora(tree)
    missing = sorted(set(kinds) - set(order))
    if missing:
        raise DataprepError(f"{manifest}: corpus {missing[0]!r} is in the rows but not in the recorded blend")
    folder = {c: CORPUS_DIR.format(i) for i, c in enumerate(order)}
    shards = {c: tar_pattern(manifest, tars[c]) for c in order if kinds.get(c) == "nemo_tarred"}
    stats = Stats(len(inputs.spec.buckets))
    multi, start = False, 0
    with export_dir(out_dir) as tmp, contextlib.ExitStack() as stack:
        files: dict[tuple[str, int], IO[str]] = {}
        for c in order:
            (tmp / folder[c]).mkdir()
            if c in shards:  # NeMo wants a manifest per tar, even an empty one
                for shard in sorted(set(shards[c][0].values())):
                    (tmp / folder[c] / f"manifest_{shard}.json").write_text("", encoding="utf-8")
            else:
                (tmp / folder[c] / "manifest.jsonl").write_text("", encoding="utf-8")
        for table, bucket in iter_manifest(manifest, inputs.bucket):
            keep = bucket >= 0
            names = corpus.slice(start, table.num_rows).filter(pa.array(keep)).to_pylist()
            start += table.num_rows
            tps = 0.0
            for row, c in zip(table.filter(pa.array(keep)).to_pylist(), names):
                if c in shards:
                    shard = shards[c][0][row["container"]]
                    rec, writes_rate = nemo_line({**row, "audio_path": row["audio_path"][len(row["container"]) + 1:]})
                    rec["shard_id"] = shard
                    key, name = (c, shard), f"manifest_{shard}.json"
                else:
                    rec, writes_rate = nemo_line(row)
                    key, name = (c, -1), "manifest.jsonl"
                if key not in files:
                    files[key] = stack.enter_context(open(tmp / folder[c] / name, "w", encoding="utf-8"))
                files[key].write(json.dumps(rec, ensure_ascii=False) + "\n")
                if row["num_tokens"] is not None:
                    tps = max(tps, int(row["num_tokens"]) / nemo_duration(row, writes_rate))
                multi = multi or (not writes_rate and row_channels(row) > 1)
            stats.add(bucket[keep], row_tokens(table)[keep], tps)
        leaves: dict[str, dict[str, Any]] = {}
        for c in order:
            if c in shards:
                pattern = shards[c][1]
                body = pattern[pattern.index("_OP_"):pattern.index("_CL_") + 4]
                leaves[c] = {"type": "nemo_tarred", "manifest_filepath": str(out / folder[c] / f"manifest_{body}.json"),
                             "tarred_audio_filepaths": pattern, "skip_missing_manifest_entries": True,
                             "tags": {"corpus": c}}
            else:
                leaves[c] = {"type": "nemo", "manifest_filepath": str(out / folder[c] / "manifest.jsonl"),
                             "tags": {"corpus": c}}
        input_cfg = [{"type": "group", "input_cfg": _node(tree, leaves), "reweight_temperature": [_temp(tree)]}]
        (tmp / "input_cfg.yaml").write_text(json.dumps(input_cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        cfg = bucketing_config(inputs.spec, stats, channel if channel is not None else (0 if multi else None))
        cfg["input_cfg"] = str(out / "input_cfg.yaml")
        if shards and len(shards) < len(order):
            cfg["force_iterable_dataset"] = True
        cfg["written"] = ["input_cfg.yaml", *(f"{folder[c]}/" for c in order)]
        write_config(tmp, cfg)
    return cfg
