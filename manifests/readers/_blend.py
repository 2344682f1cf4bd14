"""NeMo ``input_cfg`` blends: many corpora, nested groups, weights, tags, temperatures.

NeMo's ``input_cfg`` YAML (read as NeMo reads it: :mod:`manifests.nemo_yaml`), a list of datasets
(or a mapping holding one), each ``type`` ``nemo``, ``nemo_tarred``, ``lhotse``, ``lhotse_shar``,
a text type (:data:`TEXT_TYPES`, ``multimodal_conversation``: read by :mod:`._text`) or ``group`` (its ``input_cfg``
a list or another file); relative paths against the naming file's folder (docs/many-corpora.md). As ``nemo/collections/common/data/lhotse/cutset.py``: a list is
all weighted or none; a level's weights become ``w^T / sum(w^T)``; a leaf's probability is the
product down its path; ``text_field`` / ``lang_field`` pass down groups. Tags overwrite the row's
fields, an outer group's winning: ``source_lang``, ``target_lang``, ``taskname`` are columns, the
rest go into ``extra`` (a cut's ``custom``). ``corpus`` names the corpus (default: from its path);
every dataset, a second view of a manifest included, is its own corpus, and an id an earlier
corpus has is qualified ``corpus:id`` (:func:`iter_blend`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl

from manifests import storage
from manifests.containers import expand_paths
from manifests.storage import is_url
from manifests.errors import ManifestError
from manifests.schema import MODALITY_COLUMN
from manifests.nemo_yaml import load_nemo_yaml
from manifests.readers._jsonl import SORTED_OBJECT_SQL
from manifests.readers._text import CONVERSATION_TYPES, TEXT_TYPES, text_options
from manifests.validation import Validator, _show

LEAF_TYPES = ("nemo", "nemo_tarred", "lhotse", "lhotse_shar")
#: tags that set a manifest column (tag -> column); NeMo keeps each in ``cut.custom`` under the tag
COLUMN_TAGS = {"source_lang": "source_lang", "target_lang": "target_lang", "taskname": "task"}
BLEND_SUFFIXES = (".yaml", ".yml")
#: keys of a dataset / group this reader uses
ITEM_KEYS = {"type", "weight", "tags", "input_cfg", "reweight_temperature", "text_field", "lang_field",
             "manifest_filepath", "tarred_audio_filepaths", "cuts_path", "shar_path", "paths", "source_paths",
             "target_paths", "language", "source_language", "target_language"}
#: nested ``input_cfg`` files one blend may read, and datasets it may expand to (files included
#: twice counted twice): real blends have tens; a file listing the next twice, 20 deep, is refused
MAX_INCLUDES = 1000
MAX_DATASETS = 10_000


@dataclass(frozen=True)
class Leaf:
    """One corpus of a blend: where its rows are and what its rows get."""

    corpus: str
    type: str
    paths: tuple[str, ...]  # manifests / cuts files / the Shar folder, absolute
    tars: tuple[str, ...] = ()  # nemo_tarred: the audio tars (NeMo brace syntax kept)
    text_field: str = "text"
    lang_field: str = "lang"
    tags: dict[str, Any] = field(default_factory=dict)  # merged down the path (outer wins), corpus removed
    targets: tuple[str, ...] = ()  # txt_pair: the target files (paths: the source files)
    text: dict[str, Any] = field(default_factory=dict)  # text types: language, source_language, target_language

    @property
    def is_text(self) -> bool:
        """Whether :mod:`._text` reads the corpus (text-only or conversations: rows with their
        ``modality``)."""
        return self.type in (*TEXT_TYPES, *CONVERSATION_TYPES)


@dataclass(frozen=True)
class Blend:
    """A parsed ``input_cfg``: its leaves in file order, its weight tree, and warnings (one line
    each: keys it does not use, corpora it renamed)."""

    path: str
    leaves: tuple[Leaf, ...]
    root: dict[str, Any]  # {"temperature": [..] | None, "children": [node, ...]}
    warnings: tuple[str, ...] = ()

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


def _stem(path: str) -> str:
    name = Path(path.rstrip("/")).name
    name = re.sub(r"(_?_OP_.*_CL_|_?\{[^}]*\})", "", name)  # NeMo brace syntax: the shared stem
    return re.sub(r"(\.(jsonl?|gz|json|txt))+$", "", name) or name


@dataclass
class _File:
    """One YAML file of a blend: its path (relative paths resolve against its folder) and checks."""

    path: Path
    v: Validator


class _Parser:
    def __init__(self, path: Path) -> None:
        self.top = _File(path, Validator(str(path)))
        self.leaves: list[Leaf] = []
        self.names: dict[str, str] = {}
        self.loaded: dict[Path, Any] = {path: None}
        self.including: list[Path] = [path]
        self.depths: dict[Path, int] = {}
        self.numbered: dict[str, int] = {}  # the last k of each numbered name base#k
        self.items_read = 0
        self.unused: dict[str, list[str]] = {}
        self.renamed: list[str] = []

    def _path(self, f: _File, raw: Any, name: str) -> str:
        s = f.v.str_(raw, name)
        if is_url(s):
            return s
        if "://" in s or s.startswith("pipe:"):
            raise f.v.fail(name, f"only s3://, gs:// and az:// URLs are read ({s[:80]!r}); copy the data locally")
        p = Path(s).expanduser()
        return str(p if p.is_absolute() else f.path.parent / p)

    def _paths(self, f: _File, raw: Any, name: str) -> tuple[str, ...]:
        if isinstance(raw, list):
            if not raw:
                raise f.v.fail(name, "empty list")
            return tuple(self._path(f, x, f"{name}[{i}]") for i, x in enumerate(raw))
        return (self._path(f, raw, name),)

    def include(self, f: _File, raw: str, name: str) -> tuple[_File, Any]:
        """A nested ``input_cfg: other.yaml``: that file's list (a cycle, or more than
        :data:`MAX_INCLUDES` files, refused)."""
        path = Path(self._path(f, raw, name)).resolve()
        if path in self.including:
            chain = " -> ".join(p.name for p in [*self.including[self.including.index(path):], path])
            raise f.v.fail(name, f"includes itself ({chain}); refused")
        if len(self.including) > 32 or sum(1 for _ in self.loaded) > MAX_INCLUDES:
            raise f.v.fail(name, f"more than {MAX_INCLUDES} nested input_cfg files (or 32 levels); refused")
        if path not in self.loaded or self.loaded[path] is None:
            self.loaded[path] = load_nemo_yaml(path, missing=f"no such file (the input_cfg of {f.path}: {name})")
        sub = _File(path, Validator(str(path)))
        data = self.loaded[path]
        if isinstance(data, dict) and "input_cfg" in data:
            raise sub.v.fail("input_cfg", "a nested input_cfg file holds the list of datasets itself (as NeMo reads it)")
        return sub, sub.v.list_(data, "(file)")

    def depth(self, f: _File, items: list[Any]) -> int:
        """Nesting levels of ``input_cfg`` lists, nested files included (NeMo's ``count_input_cfg_levels``)."""
        inner = []
        for i, item in enumerate(items):
            sub = item.get("input_cfg") if isinstance(item, dict) else None
            if isinstance(sub, str):
                g, sub = self.include(f, sub, f"input_cfg[{i}].input_cfg")
                if g.path not in self.depths:  # each file walked once (a file included twice: no blow-up)
                    self.including.append(g.path)
                    self.depths[g.path] = self.depth(g, sub)
                    self.including.pop()
                inner.append(self.depths[g.path])
            elif isinstance(sub, list):
                inner.append(self.depth(f, sub))
        return 1 + max(inner, default=0)

    def _unused(self, f: _File, item: dict[str, Any], name: str) -> None:
        for key in item:
            if key not in ITEM_KEYS:
                self.unused.setdefault(str(key), []).append(f"{f.path.name}:{name}")

    def _name(self, f: _File, tags: dict[str, Any], paths: tuple[str, ...], text_field: str, name: str) -> str:
        """The corpus name: ``tags.corpus`` or the path's stem, made unique (a view named by its
        ``text_field``, then by its folder, then numbered)."""
        tagged = tags.pop("corpus", None)
        base = f.v.str_(tagged, f"{name}.tags.corpus") if tagged is not None else _stem(paths[0])
        parent = Path(paths[0].rstrip("/")).parent.name
        candidates = [base, *([f"{base}.{text_field}"] if text_field != "text" else []),
                      *([f"{parent}/{base}"] if parent else [])]
        corpus = next((c for c in candidates if c not in self.names), None)
        while corpus is None:
            self.numbered[base] = k = self.numbered.get(base, 1) + 1
            corpus = f"{base}#{k}" if f"{base}#{k}" not in self.names else None
        if corpus != base:
            self.renamed.append(f"{name} -> {corpus} ({base!r} names {self.names[base]})")
        self.names[corpus] = name
        return corpus

    def _text_leaf(self, f: _File, item: dict[str, Any], name: str, tags: dict[str, Any],
                   fields: tuple[str, str]) -> dict[str, Any]:
        """A text-only corpus (``paths``; ``txt_pair``: ``source_paths`` and ``target_paths``)."""
        v, kind = f.v, item["type"]
        targets: tuple[str, ...] = ()
        if kind == "txt_pair":
            if item.get("questions_path") is not None:
                raise v.fail(f"{name}.questions_path", "not read: NeMo draws a random question per pair, so a "
                                                       "pair's tokens are not fixed; put the question in the source lines")
            paths = self._paths(f, v.key(item, "source_paths", f"{name}."), f"{name}.source_paths")
            targets = self._paths(f, v.key(item, "target_paths", f"{name}."), f"{name}.target_paths")
            if len(paths) != len(targets):
                raise v.fail(f"{name}.target_paths", f"{len(targets)} files for {len(paths)} source_paths (one per source)")
        elif kind in CONVERSATION_TYPES:
            if item.get("tarred_audio_filepaths") is not None:
                raise v.fail(f"{name}.tarred_audio_filepaths", "not read for conversations (their audio in tars); "
                                                               "give the JSONL with audio files")
            paths = self._paths(f, v.key(item, "manifest_filepath", f"{name}."), f"{name}.manifest_filepath")
        else:
            paths = self._paths(f, v.key(item, "paths", f"{name}."), f"{name}.paths")
        text = text_options(kind, item)
        for key, val in text.items():
            v.str_(val, f"{name}.{key}")
        corpus = self._name(f, tags, paths, fields[0], name)
        for tag in COLUMN_TAGS:
            if tags.get(tag) is not None:
                v.str_(tags[tag], f"{name}.tags.{tag}")
        self.leaves.append(Leaf(corpus, kind, paths, (), fields[0], fields[1], tags, targets, text))
        return {"corpus": corpus}

    def _leaf(self, f: _File, item: dict[str, Any], name: str, tags: dict[str, Any],
              fields: tuple[str, str]) -> dict[str, Any]:
        v, kind = f.v, item["type"]
        if kind in (*TEXT_TYPES, *CONVERSATION_TYPES):
            return self._text_leaf(f, item, name, tags, fields)
        key = {"nemo": "manifest_filepath", "nemo_tarred": "manifest_filepath", "lhotse": "cuts_path",
               "lhotse_shar": "shar_path"}[kind]
        if kind == "lhotse" and item.get("shar_path") is not None:
            kind, key = "lhotse_shar", "shar_path"
        if kind == "nemo" and item.get("tarred_audio_filepaths") is not None:
            kind = "nemo_tarred"
        raw = v.key(item, key, f"{name}.")
        tars_raw = v.key(item, "tarred_audio_filepaths", f"{name}.") if kind == "nemo_tarred" else None
        if kind == "lhotse_shar" and isinstance(raw, dict):
            return self._shar_fields(f, raw, name, tags, fields)
        if isinstance(raw, list) and any(isinstance(x, list) for x in raw) and (
                kind == "lhotse_shar" or any(not isinstance(x, list) or len(x) != 1 for x in raw)):
            return self._weighted(f, item, name, tags, fields, kind, key)
        if kind in ("nemo", "nemo_tarred") and isinstance(raw, list) and any(isinstance(x, list) for x in raw):
            # [[path], ...]: NeMo weighs each by its line count: the manifests' rows in proportion, one corpus
            raw = [x[0] for x in raw]
            if isinstance(tars_raw, list):
                tars_raw = [t[0] if isinstance(t, list) and len(t) == 1 else t for t in tars_raw]
        paths = self._paths(f, raw, f"{name}.{key}")
        tars: tuple[str, ...] = ()
        if kind == "nemo_tarred":
            tars = self._paths(f, tars_raw, f"{name}.tarred_audio_filepaths")
        text_field, lang_field = fields
        corpus = self._name(f, tags, paths, text_field, name)
        for tag in COLUMN_TAGS:
            if tags.get(tag) is not None:
                v.str_(tags[tag], f"{name}.tags.{tag}")
        self.leaves.append(Leaf(corpus, kind, paths, tars, text_field, lang_field, tags))
        return {"corpus": corpus}

    def _weighted(self, f: _File, item: dict[str, Any], name: str, tags: dict[str, Any],
                  fields: tuple[str, str], kind: str, key: str) -> dict[str, Any]:
        """``[[path, weight], ...]`` (``manifest_filepath``, ``shar_path``): NeMo muxes the paths
        with these weights, untempered; here a group of one corpus each, its temperature 1."""
        v = f.v
        raw = item[key]
        tars_raw = item.get("tarred_audio_filepaths") if kind == "nemo_tarred" else None
        if tars_raw is not None and (not isinstance(tars_raw, list) or len(tars_raw) != len(raw)):
            raise v.fail(f"{name}.tarred_audio_filepaths", f"expected a list of {len(raw)} entries, one per manifest")
        children = []
        for i, entry in enumerate(raw):
            ename = f"{name}.{key}[{i}]"
            pair = v.list_(entry, ename)
            if len(pair) != 2:
                raise v.fail(ename, f"expected [path, weight] (as every entry of this list), got {_show(pair)}")
            weight = v.number(pair[1], f"{ename}[1]", positive=True)
            sub: dict[str, Any] = {"type": kind, key: pair[0]}
            if tars_raw is not None:
                tar = tars_raw[i]
                sub["tarred_audio_filepaths"] = tar[0] if isinstance(tar, list) and len(tar) == 1 else tar
            children.append({"weight": weight, **self._leaf(f, sub, ename, dict(tags), fields)})
        return {"temperature": 1.0, "children": children}

    def _shar_fields(self, f: _File, raw: dict[str, Any], name: str, tags: dict[str, Any],
                     fields: tuple[str, str]) -> dict[str, Any]:
        """``shar_path: {cuts: [...], recording: [...]}``: the i-th cuts file's audio in the i-th
        recording tar (brace patterns expanded); other fields are not read (named in a warning)."""
        v, key = f.v, f"{name}.shar_path"
        cuts = self._paths(f, v.key(raw, "cuts", f"{key}."), f"{key}.cuts")
        recs = self._paths(f, v.key(raw, "recording", f"{key}."), f"{key}.recording")
        n_cuts, n_recs = len(expand_paths(list(cuts))), len(expand_paths(list(recs)))
        if n_cuts != n_recs:
            raise v.fail(f"{key}.recording", f"{n_recs} tars for {n_cuts} cuts files (one per cuts file, in order)")
        for other in raw:
            if other not in ("cuts", "recording"):
                self.unused.setdefault(f"shar_path.{other}", []).append(f"{f.path.name}:{name}")
        corpus = self._name(f, tags, (str(Path(cuts[0]).parent),), fields[0], name)
        self.leaves.append(Leaf(corpus, "lhotse_shar", cuts, recs, fields[0], fields[1], tags))
        return {"corpus": corpus}

    def items(self, f: _File, raw: Any, name: str, temps: list[float] | float | None, tags: dict[str, Any],
              fields: tuple[str, str]) -> dict[str, Any]:
        """A list of items as a tree node; ``temps``: this list's temperature and the deeper ones;
        ``tags``: the enclosing groups' (outer wins); ``fields``: the inherited text / lang fields."""
        if isinstance(raw, str):
            f, raw = self.include(f, raw, name)
            self.including.append(f.path)
            try:
                return self.items(f, raw, "input_cfg", temps, tags, fields)
            finally:
                self.including.pop()
        v = f.v
        items = v.list_(raw, name)
        if not items:
            raise v.fail(name, "empty; expected at least one dataset")
        self.items_read += len(items)
        if self.items_read > MAX_DATASETS:
            raise v.fail(name, f"the blend expands to more than {MAX_DATASETS:,} datasets; refused")
        here, below = (temps[0], temps[1:]) if isinstance(temps, list) else (temps, temps)
        children = []
        for i, item in enumerate(items):
            iname = f"{name}[{i}]"
            item = v.obj(item, iname)
            kind = v.str_(v.key(item, "type", f"{iname}."), f"{iname}.type")
            if kind not in (*LEAF_TYPES, *TEXT_TYPES, *CONVERSATION_TYPES, "group"):
                raise v.fail(f"{iname}.type", f"{kind!r} is not read (expected one of "
                                              f"{', '.join((*LEAF_TYPES, *TEXT_TYPES, *CONVERSATION_TYPES))}, group)")
            self._unused(f, item, iname)
            weight = None if item.get("weight") is None else v.number(item["weight"], f"{iname}.weight", positive=True)
            own = dict(v.obj(item.get("tags") or {}, f"{iname}.tags"))
            merged = {**own, **tags}
            sub_fields = (v.str_(item.get("text_field", fields[0]), f"{iname}.text_field"),
                          v.str_(item.get("lang_field", fields[1]), f"{iname}.lang_field"))
            if kind == "group":
                sub = _temps(v, item.get("reweight_temperature"), f"{iname}.reweight_temperature")
                node = self.items(f, v.key(item, "input_cfg", f"{iname}."), f"{iname}.input_cfg",
                                  below if sub is None else sub, merged, sub_fields)
            else:
                node = self._leaf(f, item, iname, merged, sub_fields)
            children.append({"weight": weight, **node})
        weights = [c["weight"] for c in children]
        if any(w is None for w in weights) and any(w is not None for w in weights):
            missing = weights.index(None)
            raise v.fail(f"{name}[{missing}].weight", "missing: when weighting, every dataset of a list needs a weight")
        return {"temperature": here, "children": children}


#: keys of a blend file's top-level mapping this reader uses
TOP_KEYS = {"input_cfg", "reweight_temperature", "text_field", "lang_field"}


def read_blend(path: str | Path) -> Blend:
    """Parse and check a NeMo ``input_cfg`` YAML file (see the module docstring)."""
    p = Path(path)
    raw = load_nemo_yaml(p)
    parser = _Parser(p.resolve() if p.exists() else p)
    f = parser.top
    v = f.v
    temps: Any = None
    fields = ("text", "lang")
    if isinstance(raw, dict):
        if "input_cfg" not in raw:
            raise v.fail("input_cfg", "missing (expected a list of datasets, or a mapping holding input_cfg)")
        temps = _temps(v, raw.get("reweight_temperature"), "reweight_temperature")
        fields = (v.str_(raw.get("text_field", "text"), "text_field"), v.str_(raw.get("lang_field", "lang"), "lang_field"))
        for key in raw:
            if key not in TOP_KEYS:
                parser.unused.setdefault(str(key), []).append(f"{f.path.name}")
        raw = raw["input_cfg"]
    if isinstance(raw, str):
        f, raw = parser.include(f, raw, "input_cfg")
        parser.including.append(f.path)
    items = f.v.list_(raw, "input_cfg")
    levels = parser.depth(f, items)
    if isinstance(temps, list) and len(temps) != levels:
        raise v.fail("reweight_temperature", f"{len(temps)} values for {levels} nesting levels "
                                             "(give one per level, or a scalar for all)")
    root = parser.items(f, items, "input_cfg", temps, {}, fields)
    warnings = []
    if parser.unused:
        keys = ", ".join(f"{k} ({v_[0]}{' ...' if len(v_) > 1 else ''})" for k, v_ in parser.unused.items())
        warnings.append(f"{path}: not used by dataprep (NeMo loader options; give them to the trainer): {keys}")
    if parser.renamed:
        warnings.append(f"{path}: corpora renamed to keep them apart: {'; '.join(parser.renamed)}")
    return Blend(str(path), tuple(parser.leaves), root, tuple(warnings))


def tag_rows(frame: pl.DataFrame, leaf: Leaf) -> pl.DataFrame:
    """A reader frame of ``leaf``'s rows with ``corpus`` set, ``lang`` read from the leaf's
    ``lang_field``, and its tags overwriting the row's fields (module docstring); vectorized.
    ``lang`` taken from ``target_lang`` / ``source_lang`` (the row had none of its own) follows
    the tagged values."""
    cols: list[pl.Expr] = [pl.lit(leaf.corpus, pl.String).alias("corpus")]
    if leaf.lang_field != "lang":
        own = pl.col("extra").str.json_path_match(f"$[{json.dumps(leaf.lang_field)}]")
        cols.append(pl.coalesce(own, pl.col("lang")).alias("lang"))
    df = frame.with_columns(cols)
    tagged = {col: pl.lit(leaf.tags[tag], pl.String) for tag, col in COLUMN_TAGS.items()
              if leaf.tags.get(tag) is not None}
    if tagged:
        derived = pl.col("lang").is_null() | (pl.col("lang") == pl.coalesce("target_lang", "source_lang"))
        df = df.with_columns(derived.fill_null(False).alias("__derived")).with_columns(**tagged)
        df = df.with_columns(pl.when("__derived").then(pl.coalesce("target_lang", "source_lang"))
                             .otherwise(pl.col("lang")).alias("lang")).drop("__derived")
    # a conversation's system_prompt / context tags are turns (its extra.context holds their text)
    others = {k: val for k, val in leaf.tags.items() if k not in COLUMN_TAGS
              and not (leaf.type in CONVERSATION_TYPES and k in ("system_prompt", "context"))}
    if not others:
        return df
    def lit(obj: dict[str, Any]) -> str:
        return "'" + json.dumps(obj, sort_keys=True, ensure_ascii=False).replace("'", "''") + "'"

    # each tag replaces the field whole (NeMo's setattr): the fields removed, then the tags set
    rest = f"json_merge_patch(json_merge_patch(coalesce(extra, '{{}}'), {lit(dict.fromkeys(others))}), {lit(others)})"
    con = duckdb.connect()
    try:
        con.register("f", df.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("i"), "extra"))
        merged = con.sql("SELECT " + SORTED_OBJECT_SQL.format(rest=rest) + " AS extra FROM f ORDER BY i").pl()["extra"]
    finally:
        con.close()
    return df.with_columns(merged.alias("extra"))


def _hashes(ids: pl.Series) -> np.ndarray:
    return ids.drop_nulls().hash(seed=0).to_numpy()


def iter_blend(blend: Blend, read: Callable[[Leaf], Iterator[pl.DataFrame]]) -> Iterator[pl.DataFrame]:
    """Every leaf's frames in file order, each row tagged (:func:`tag_rows`); ``read`` reads a
    leaf with the source readers. A row whose id an earlier corpus has (a second view of a
    manifest, ``audio/u1.flac`` in two folders) gets the id ``corpus:id``; ids repeated within
    one corpus stay as they are (``duplicate_id``). Memory: 8 bytes per id (a sorted hash array).
    A blend holding a text-only corpus marks every row's ``modality`` (``audio`` / ``text``)."""
    earlier = np.empty(0, np.uint64)
    mixed = any(leaf.is_text for leaf in blend.leaves)
    for leaf in blend.leaves:
        mine = []
        for frame in read(leaf):
            df = tag_rows(frame, leaf)
            if mixed and not leaf.is_text:
                df = df.with_columns(pl.lit("audio").alias(MODALITY_COLUMN))
            if earlier.size and df["id"].null_count() < df.height:
                h = df["id"].hash(seed=0).to_numpy()
                pos = np.minimum(np.searchsorted(earlier, h), earlier.size - 1)
                hit = pl.Series(earlier[pos] == h) & df["id"].is_not_null()
                if hit.any():
                    df = df.with_columns(pl.when(hit).then(pl.lit(leaf.corpus + ":") + pl.col("id"))
                                         .otherwise(pl.col("id")).alias("id"))
            mine.append(_hashes(df["id"]))
            yield df
        earlier = np.union1d(earlier, np.concatenate(mine)) if mine else earlier


def check_exists(blend: Blend) -> None:
    """A one-line error for a leaf whose files are missing."""
    for leaf in blend.leaves:
        for p in (*leaf.paths, *leaf.targets):
            if "_OP_" not in p and "{" not in p and not (storage.exists_or_folder(p) if is_url(p) else Path(p).exists()):
                raise ManifestError(f"{blend.path}: corpus {leaf.corpus}: {p}: no such file or directory")
