"""NeMo ``input_cfg`` blends: many corpora, nested groups, weights, tags, temperatures.

A blend file is NeMo's ``input_cfg`` YAML: a list of datasets (or a mapping holding ``input_cfg``
and ``reweight_temperature``), each ``type`` one of ``nemo``, ``nemo_tarred``, ``lhotse``,
``lhotse_shar`` or ``group`` (nested), with optional ``weight``, ``tags``, ``text_field`` and
``lang_field``; relative paths resolve against the file's folder (docs/many-corpora.md). NeMo's
semantics (``nemo/collections/common/data/lhotse/cutset.py``): every item of a list has a weight
or none has; a level's weights ``w`` become ``w^T / sum(w^T)`` with its temperature ``T`` (a
scalar, or one per nesting level, top first; an item's own replaces it below it); a leaf's
probability is the product down its path. Tags: ``corpus`` names the corpus (default: a stable
name from its path); ``lang``, ``source_lang``, ``target_lang``, ``taskname`` / ``task`` fill missing
fields, others go into ``extra`` (the row's own field wins; an inner group's over an outer one's).
:func:`read_blend` checks the file (one-line ``FILE: field: problem`` errors) and returns a
:class:`Blend`: its leaves in file order and the tree (:meth:`Blend.tree`) compile records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from manifests import storage
from manifests.storage import is_url
from manifests.errors import ManifestError
from manifests.readers._jsonl import SORTED_OBJECT_SQL
from manifests.validation import Validator, load_yaml_file

LEAF_TYPES = ("nemo", "nemo_tarred", "lhotse", "lhotse_shar")
#: tags that fill a manifest column (tag -> column)
COLUMN_TAGS = {"lang": "lang", "source_lang": "source_lang", "target_lang": "target_lang", "taskname": "task",
               "task": "task"}
BLEND_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Leaf:
    """One corpus of a blend: where its rows are and what its rows get."""

    corpus: str
    type: str
    paths: tuple[str, ...]  # manifests / cuts files / the Shar folder, absolute
    tars: tuple[str, ...] = ()  # nemo_tarred: the audio tars (NeMo brace syntax kept)
    text_field: str = "text"
    lang_field: str = "lang"
    tags: dict[str, Any] = field(default_factory=dict)  # merged down the path (inner wins), corpus removed


@dataclass(frozen=True)
class Blend:
    """A parsed ``input_cfg``: its leaves in file order and its weight tree."""

    path: str
    leaves: tuple[Leaf, ...]
    root: dict[str, Any]  # {"temperature": [..] | None, "children": [node, ...]}

    def tree(self) -> dict[str, Any]:
        """The blend as recorded in a manifest's metadata: nodes ``{"weight", "children"}`` or
        ``{"weight", "corpus"}``, and per list the ``temperature`` it was re-weighted with."""
        return self.root

    @property
    def weighted(self) -> bool:
        """Whether any item of the blend has a weight."""
        def any_weight(node: dict[str, Any]) -> bool:
            return any(c.get("weight") is not None or any_weight(c) for c in node.get("children", []))

        return any_weight(self.root)


def is_blend_path(path: str | Path) -> bool:
    """Whether ``path`` names an ``input_cfg`` YAML file (by suffix)."""
    return Path(path).suffix.lower() in BLEND_SUFFIXES


def _temps(v: Validator, raw: Any, name: str) -> list[float] | float | None:
    if raw is None:
        return None
    if isinstance(raw, list):
        return [v.number(t, f"{name}[{i}]", lo=0) for i, t in enumerate(raw)]
    return v.number(raw, name, lo=0)


def _depth(items: list[Any]) -> int:
    """Nesting levels of ``input_cfg`` lists (NeMo's ``count_input_cfg_levels``)."""
    inner = [_depth(i["input_cfg"]) for i in items if isinstance(i, dict) and isinstance(i.get("input_cfg"), list)]
    return 1 + max(inner, default=0)


def _stem(path: str) -> str:
    name = Path(path.rstrip("/")).name
    name = re.sub(r"(_?_OP_.*_CL_|_?\{[^}]*\})", "", name)  # NeMo brace syntax: the shared stem
    return re.sub(r"(\.(jsonl?|gz|json))+$", "", name) or name


class _Parser:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.v = Validator(str(path))
        self.leaves: list[Leaf] = []
        self.names: dict[str, str] = {}

    def _path(self, raw: Any, name: str) -> str:
        s = self.v.str_(raw, name)
        if is_url(s):
            return s
        if "://" in s or s.startswith("pipe:"):
            raise self.v.fail(name, f"only s3://, gs:// and az:// URLs are read ({s[:80]!r}); copy the data locally")
        p = Path(s).expanduser()
        return str(p if p.is_absolute() else self.path.parent / p)

    def _paths(self, raw: Any, name: str) -> tuple[str, ...]:
        if isinstance(raw, list):
            if not raw:
                raise self.v.fail(name, "empty list")
            if any(isinstance(x, list) for x in raw):
                raise self.v.fail(name, "a list of [path, weight] pairs: write each as its own dataset in a group")
            return tuple(self._path(x, f"{name}[{i}]") for i, x in enumerate(raw))
        return (self._path(raw, name),)

    def _leaf(self, item: dict[str, Any], name: str, tags: dict[str, Any]) -> Leaf:
        v, kind = self.v, item["type"]
        key = {"nemo": "manifest_filepath", "nemo_tarred": "manifest_filepath", "lhotse": "cuts_path",
               "lhotse_shar": "shar_path"}[kind]
        if kind == "lhotse" and item.get("shar_path") is not None:
            kind, key = "lhotse_shar", "shar_path"
        if kind == "nemo" and item.get("tarred_audio_filepaths") is not None:
            kind = "nemo_tarred"
        paths = self._paths(v.key(item, key, f"{name}."), f"{name}.{key}")
        tars: tuple[str, ...] = ()
        if kind == "nemo_tarred":
            tars = self._paths(v.key(item, "tarred_audio_filepaths", f"{name}."), f"{name}.tarred_audio_filepaths")
        if kind == "lhotse_shar" and len(paths) != 1:
            raise v.fail(f"{name}.shar_path", "one Shar folder per dataset (write others as their own datasets)")
        corpus = tags.pop("corpus", None)
        corpus = v.str_(corpus, f"{name}.tags.corpus") if corpus is not None else _stem(paths[0])
        if corpus in self.names:
            raise v.fail(f"{name}.tags.corpus", f"corpus {corpus!r} is also {self.names[corpus]}; name each "
                                                "dataset apart (tags.corpus)")
        self.names[corpus] = name
        for tag, col in COLUMN_TAGS.items():
            if tags.get(tag) is not None:
                v.str_(tags[tag], f"{name}.tags.{tag}")
        text_field = v.str_(item.get("text_field", "text"), f"{name}.text_field")
        lang_field = v.str_(item.get("lang_field", "lang"), f"{name}.lang_field")
        leaf = Leaf(corpus, kind, paths, tars, text_field, lang_field, tags)
        self.leaves.append(leaf)
        return leaf

    def items(self, raw: Any, name: str, temps: list[float] | float | None, tags: dict[str, Any]) -> dict[str, Any]:
        """A list of items as a tree node; ``temps``: this list's temperature and the deeper ones."""
        v = self.v
        items = v.list_(raw, name)
        if not items:
            raise v.fail(name, "empty; expected at least one dataset")
        here, below = (temps[0], temps[1:]) if isinstance(temps, list) else (temps, temps)
        children = []
        for i, item in enumerate(items):
            iname = f"{name}[{i}]"
            item = v.obj(item, iname)
            kind = v.str_(v.key(item, "type", f"{iname}."), f"{iname}.type")
            if kind not in (*LEAF_TYPES, "group"):
                raise v.fail(f"{iname}.type", f"{kind!r} is not read (expected one of {', '.join(LEAF_TYPES)}, group)")
            weight = None if item.get("weight") is None else v.number(item["weight"], f"{iname}.weight", positive=True)
            own = dict(v.obj(item.get("tags") or {}, f"{iname}.tags"))
            merged = {**tags, **own}
            if kind == "group":
                sub = _temps(v, item.get("reweight_temperature"), f"{iname}.reweight_temperature")
                node = self.items(v.key(item, "input_cfg", f"{iname}."), f"{iname}.input_cfg",
                                  below if sub is None else sub, merged)
            else:
                node = {"corpus": self._leaf(item, iname, merged).corpus}
            children.append({"weight": weight, **node})
        weights = [c["weight"] for c in children]
        if any(w is None for w in weights) and any(w is not None for w in weights):
            missing = weights.index(None)
            raise v.fail(f"{name}[{missing}].weight", "missing: when weighting, every dataset of a list needs a weight")
        return {"temperature": here, "children": children}


def read_blend(path: str | Path) -> Blend:
    """Parse and check a NeMo ``input_cfg`` YAML file (see the module docstring)."""
    p = Path(path)
    raw = load_yaml_file(p)
    parser = _Parser(p.resolve() if p.exists() else p)
    v = parser.v
    temps: Any = None
    if isinstance(raw, dict):
        if "input_cfg" not in raw:
            raise v.fail("input_cfg", "missing (expected a list of datasets, or a mapping holding input_cfg)")
        temps, raw = _temps(v, raw.get("reweight_temperature"), "reweight_temperature"), raw["input_cfg"]
    items = v.list_(raw, "input_cfg")
    levels = _depth(items)
    if isinstance(temps, list) and len(temps) != levels:
        raise v.fail("reweight_temperature", f"{len(temps)} values for {levels} nesting levels "
                                             "(give one per level, or a scalar for all)")
    root = parser.items(items, "input_cfg", temps, {})
    return Blend(str(path), tuple(parser.leaves), root)


def tag_rows(frame: pl.DataFrame, leaf: Leaf) -> pl.DataFrame:
    """A reader frame of ``leaf``'s rows with ``corpus`` set, ``lang`` read from the leaf's
    ``lang_field``, and its tags filling missing fields (module docstring); vectorized."""
    cols: list[pl.Expr] = [pl.lit(leaf.corpus, pl.String).alias("corpus")]
    if leaf.lang_field != "lang":
        own = pl.col("extra").str.json_path_match(f"$[{json.dumps(leaf.lang_field)}]")
        cols.append(pl.coalesce(own, pl.col("lang")).alias("lang"))
    df = frame.with_columns(cols)
    filled = {}
    for tag, col in COLUMN_TAGS.items():
        if leaf.tags.get(tag) is not None and col not in filled:
            filled[col] = pl.col(col).fill_null(pl.lit(leaf.tags[tag], pl.String))
    if filled:
        df = df.with_columns(**filled).with_columns(pl.coalesce("lang", "target_lang", "source_lang").alias("lang"))
    others = {k: val for k, val in leaf.tags.items() if k not in COLUMN_TAGS}
    if not others:
        return df
    tags_json = json.dumps(others, sort_keys=True, ensure_ascii=False)
    con = duckdb.connect()
    try:
        con.register("f", df.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("i"), "extra"))
        lit = "'" + tags_json.replace("'", "''") + "'"
        merged = con.sql("SELECT " + SORTED_OBJECT_SQL.format(rest=f"json_merge_patch({lit}, coalesce(extra, '{{}}'))")
                         + " AS extra FROM f ORDER BY i").pl()["extra"]
    finally:
        con.close()
    return df.with_columns(merged.alias("extra"))


def iter_blend(blend: Blend, read: Callable[[Leaf], Iterator[pl.DataFrame]]) -> Iterator[pl.DataFrame]:
    """Every leaf's frames in file order, each row tagged (:func:`tag_rows`); ``read`` reads a
    leaf with the source readers."""
    for leaf in blend.leaves:
        for frame in read(leaf):
            yield tag_rows(frame, leaf)


def check_exists(blend: Blend) -> None:
    """A one-line error for a leaf whose files are missing."""
    for leaf in blend.leaves:
        for p in leaf.paths:
            if "_OP_" not in p and "{" not in p and not (storage.exists_or_folder(p) if is_url(p) else Path(p).exists()):
                raise ManifestError(f"{blend.path}: corpus {leaf.corpus}: {p}: no such file or directory")
