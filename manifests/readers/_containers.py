"""Audio kept in containers: NeMo tarred datasets, Lhotse Shar, WebDataset tars, Hugging Face Parquet.

Every reader yields rows of :data:`manifests.schema.FULL_REJECTS_POLARS_SCHEMA` (the rejects
columns plus the container addressing), and for Hugging Face Parquet also ``__audio_bytes``
(the member's bytes, for a header probe without another read; compile drops it). A row's
``audio_path`` is ``<container>:<member>`` (``<file.parquet>:<row>``): unique per utterance,
for messages; the audio is fetched by the container columns. Tars are indexed from their
headers only (:func:`manifests.containers.index_tar`); no member is extracted.

Reasons beyond the line-based readers': ``missing_shard`` (a tar a row needs does not exist),
``missing_member`` (named but not in its tar), ``truncated_member`` (its data runs past the
end of the tar), ``unlisted_member`` (a NeMo / Shar tar's audio member no manifest line names:
one reject row per member, origin ``tar:member``), ``missing_audio`` (a WebDataset key or a
Parquet row without audio bytes), ``missing_field`` (a WebDataset key with audio but no text).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from manifests import storage, store_facts
from manifests.containers import AUDIO_EXTENSIONS, TarIndex, index_tar, read_range
from manifests.errors import DataprepError
from manifests.readers._jsonl import iter_lhotse, iter_nemo
from manifests.readers._normalize import FIELDS, corpus_from_extra, finish, relabel
from manifests.readers._tabular import (
    _labels,
    _raw_from_columns,
    _type_name,
    column_map,
)
from manifests.schema import FULL_REJECTS_POLARS_SCHEMA, conform

#: text columns of a Hugging Face audio Parquet, tried in this order after ``--text-field``
HF_TEXT_COLUMNS = ("text", "sentence", "transcription")
#: bytes of audio per chunk of a Hugging Face Parquet (rows per chunk follow from it)
HF_CHUNK_BYTES = 64 << 20
#: tars of a store indexed at once (each a chain of header range reads)
TAR_INDEX_THREADS = 16
_WDS_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


def _abs(path: str | os.PathLike[str]) -> str:
    return os.fspath(path) if storage.is_url(os.fspath(path)) else str(Path(path).expanduser().resolve())


def _isfile(path: str) -> bool:
    return storage.exists(path) if storage.is_url(path) else os.path.isfile(path)


def _index_frame(idx: TarIndex, shard: int | None = None) -> pl.DataFrame:
    """One row per member: name, its stem (basename without extension), extension, offset, size."""
    names = pl.Series("member", idx.names, dtype=pl.String)
    base = names.str.split("/").list.last()
    return pl.DataFrame({
        "member": names,
        "base": base,
        "stem": base.str.replace(r"\.[^.]*$", ""),
        "ext": base.str.extract(r"\.([^.]*)$").str.to_lowercase(),
        "member_offset": pl.Series(idx.offsets, dtype=pl.Int64),
        "member_size": pl.Series(idx.sizes, dtype=pl.Int64),
        "truncated": pl.Series([n in idx.truncated for n in idx.names] if idx.truncated else [False] * len(names),
                               dtype=pl.Boolean),
        "shard": pl.Series([shard] * len(names), dtype=pl.Int64),
    })


def _set_problem(df: pl.DataFrame, cond: pl.Expr, reason: str, detail: pl.Expr) -> pl.DataFrame:
    """Give rows without a reason yet that meet ``cond`` this reason and ``origin: detail``."""
    hit = pl.col("reason").is_null() & cond.fill_null(False)
    return df.with_columns(
        pl.when(hit).then(pl.lit(reason)).otherwise(pl.col("reason")).alias("reason"),
        pl.when(hit).then(pl.format("{}: {}", pl.col("origin"), detail)).otherwise(pl.col("detail")).alias("detail"),
    )


def _unlisted(idx: TarIndex, used: set[str], audio_only: bool) -> pl.DataFrame:
    """Reject rows for the members of ``idx`` no manifest row named."""
    frame = _index_frame(idx).filter(~pl.col("member").is_in(list(used)))
    if audio_only:
        frame = frame.filter(pl.col("ext").is_in(list(AUDIO_EXTENSIONS)))
    if not frame.height:
        return pl.DataFrame(schema=FULL_REJECTS_POLARS_SCHEMA)
    tar = _abs(idx.path)
    out = frame.select(
        pl.col("member").alias("id"),
        (pl.lit(tar + ":") + pl.col("member")).alias("audio_path"),
        (pl.lit(idx.path + ":") + pl.col("member")).alias("origin"),
        pl.lit("unlisted_member").alias("reason"),
        (pl.lit(idx.path + ":") + pl.col("member") + pl.lit(": member is in the tar but no manifest line names it"))
        .alias("detail"),
        pl.lit(tar).alias("container"), "member_offset", "member_size",
    )
    return conform(out, FULL_REJECTS_POLARS_SCHEMA)


def _container_rejects(idx: TarIndex) -> pl.DataFrame:
    """Reject rows for what no member row can carry: the cut-off tail of a tar without its
    end-of-archive block (one ``truncated_container`` row: members after the cut are unknown),
    data after the end-of-archive block (one ``trailing_data`` row: tars joined end to end, the
    members after the first end are not read) and every entry that is not a regular file (``not_a_file``, one row each)."""
    tar = _abs(idx.path)
    rows: dict[str, list[object]] = {"id": [], "audio_path": [], "origin": [], "reason": [], "detail": []}

    def add(name: str, origin: str, reason: str, detail: str) -> None:
        for k, v in zip(rows, (name, f"{tar}:{name}" if name else None, origin, reason, f"{origin}: {detail}")):
            rows[k].append(v)

    if idx.problem is not None:
        add("", idx.path, "truncated_container", f"{idx.problem}; members after it are lost")
    if idx.trailing is not None:
        add("", idx.path, "trailing_data", idx.trailing)
    for _, name, kind in idx.others:
        add(name, f"{idx.path}:{name}", "not_a_file", f"a {kind}, not a file: its bytes are not in the tar")
    if not rows["id"]:
        return pl.DataFrame(schema=FULL_REJECTS_POLARS_SCHEMA)
    out = pl.DataFrame(rows, schema={k: pl.String for k in rows}).with_columns(
        pl.when(pl.col("id") != "").then(pl.col("id")).otherwise(pl.lit(Path(idx.path).name)).alias("id"),
        pl.lit(tar).alias("container"))
    return conform(out, FULL_REJECTS_POLARS_SCHEMA)


def _attach_members(df: pl.DataFrame, members: pl.DataFrame, key: str, tar_of: pl.Expr, match: str) -> pl.DataFrame:
    """Join the reader rows ``df`` (with ``__shard`` and ``key``) to tar members (``shard`` and the
    column ``match``: ``base`` name or ``stem``), set the container columns, and reject rows whose
    member is absent, held by several members (``duplicate_member``) or truncated."""
    df = df.with_row_index("__i").join(
        members.rename({"shard": "__shard"}), left_on=["__shard", key], right_on=["__shard", match],
        how="left", maintain_order="left"
    ).with_columns(pl.len().over("__i").alias("__matches")).unique("__i", keep="first", maintain_order=True).drop("__i")
    df = _set_problem(df, pl.col("member").is_null(), "missing_member",
                      pl.format("{} has no member for '{}'", tar_of, pl.col(key)))
    df = _set_problem(df, pl.col("__matches") > 1, "duplicate_member",
                      pl.format("{} has {} members for '{}': which is its audio cannot be told", tar_of,
                                pl.col("__matches"), pl.col(key)))
    df = _set_problem(df, pl.col("truncated"), "truncated_member",
                      pl.format("{}:{}: member data runs past the end of the tar (truncated)", tar_of, pl.col("member")))
    has = pl.col("member").is_not_null()
    return df.with_columns(
        pl.when(has).then(pl.col("__tar_abs")).alias("container"),
        pl.when(has).then(pl.col("__tar_abs") + pl.lit(":") + pl.col("member")).otherwise(pl.col("audio_path"))
        .alias("audio_path"),
    )


class _Tars:
    """Tar indexes opened on first use; ``None`` for a tar that does not exist."""

    def __init__(self, tars: Sequence[str]) -> None:
        self.tars = list(tars)
        self._idx: dict[int, TarIndex | None] = {}
        self.used: dict[int, set[str]] = {}

    def get(self, shard: int) -> TarIndex | None:
        if shard not in self._idx:
            path = self.tars[shard]
            self._idx[shard] = index_tar(path) if _isfile(path) else None
            self.used.setdefault(shard, set())
        return self._idx[shard]

    def index_urls(self) -> None:
        """Index every tar in a store at once, their headers read in parallel (bounded): each
        tar's scan is a chain of requests, so one at a time would add their round trips."""
        todo = [s for s in range(len(self.tars)) if s not in self._idx and storage.is_url(self.tars[s])]
        if len(todo) > 1:
            with ThreadPoolExecutor(min(len(todo), TAR_INDEX_THREADS)) as pool:
                list(pool.map(self.get, todo))

    def members(self, shards: Sequence[int]) -> pl.DataFrame:
        frames = [_index_frame(idx, s) for s in shards if 0 <= s < len(self.tars) and (idx := self.get(s)) is not None]
        empty = _index_frame(TarIndex(""), 0).clear()
        return pl.concat([empty, *frames]) if frames else empty

    def unlisted(self, audio_only: bool) -> Iterator[pl.DataFrame]:
        """Per tar: its unlisted members, its cut-off tail and its non-file entries, as rejects."""
        for s in range(len(self.tars)):
            idx = self.get(s)
            if idx is not None:
                for frame in (_unlisted(idx, self.used[s], audio_only), _container_rejects(idx)):
                    if frame.height:
                        yield frame


def _with_shard_paths(df: pl.DataFrame, tars: Sequence[str]) -> pl.DataFrame:
    """``__tar`` (as given) and ``__tar_abs`` of each row's ``__shard`` (null when out of range)."""
    lut = pl.DataFrame({"__shard": pl.Series(range(len(tars)), dtype=pl.Int64), "__tar": list(tars),
                        "__tar_abs": [_abs(t) for t in tars]})
    return df.join(lut, on="__shard", how="left", maintain_order="left")


def _shard_problems(df: pl.DataFrame, tars: Sequence[str]) -> pl.DataFrame:
    df = _set_problem(df, pl.col("__shard").is_null() | pl.col("__tar").is_null(), "missing_shard",
                      pl.format("shard_id {} names no tar ({} given)", pl.col("__shard").cast(pl.String).fill_null("<none>"),
                                pl.lit(len(tars))))
    exists = {t: _isfile(t) for t in tars}
    return _set_problem(df, pl.col("__tar").replace_strict(exists, default=True, return_dtype=pl.Boolean).not_(),
                        "missing_shard", pl.format("{}: no such tar shard", pl.col("__tar")))


def iter_nemo_tarred(
    manifests: Sequence[str], tars: Sequence[str], *, text_field: str, chunk_rows: int, corpus_field: bool = True
) -> Iterator[pl.DataFrame]:
    """A NeMo tarred dataset: manifest lines matched to members of ``tars`` as NeMo does.

    A line's shard is its ``shard_id``; without one, the index of its manifest when there
    are as many manifests as tars (NeMo's sharded manifests), else 0 for a single tar. Its
    member is the one of that tar whose file name, extension included, equals the file name of
    the line's ``audio_filepath`` (never a member of the same stem: ``a.flac`` is not ``a.wav``'s
    audio); a name held by several members is a ``duplicate_member``. Unlisted audio members,
    a tar's cut-off tail and its non-file entries end as rejects. ``corpus_field``: as
    :func:`manifests.readers.iter_source`'s.
    """
    if not tars:
        raise DataprepError("--tarred-audio: no tar files given")
    if urls := [u for u in (*manifests, *tars) if storage.is_url(u)]:
        store_facts.infos(urls)  # one listing a folder instead of a HEAD each
    store = _Tars(tars)
    store.index_urls()
    for mi, manifest in enumerate(manifests):
        if not (storage.exists(manifest) if storage.is_url(manifest) else Path(manifest).is_file()):
            raise DataprepError(f"{manifest}: no such tarred-dataset manifest")
        mpath = store_facts.fetch_local(manifest)
        default = mi if len(manifests) == len(tars) else (0 if len(tars) == 1 else None)
        for frame in relabel(iter_nemo(mpath, text_field=text_field, audio_root=None, chunk_rows=chunk_rows),
                             str(mpath), manifest):
            sid = frame["extra"].str.json_path_match("$.shard_id").cast(pl.Int64, strict=False)
            df = frame.with_columns(sid.fill_null(default).alias("__shard") if default is not None else sid.alias("__shard"),
                                    pl.col("audio_path").str.split("/").list.last().alias("__base"))
            df = _with_shard_paths(df, tars)
            df = _shard_problems(df, tars)
            shards = df.filter(pl.col("reason").is_null())["__shard"].unique().drop_nulls().to_list()
            members = store.members(sorted(int(s) for s in shards))
            df = _attach_members(df, members.drop("ext", "stem"), "__base", pl.col("__tar"), "base")
            for s, names in df.filter(pl.col("member").is_not_null()).group_by("__shard").agg("member").iter_rows():
                store.used[int(s)].update(names)
            out = conform(df, FULL_REJECTS_POLARS_SCHEMA)
            yield corpus_from_extra(out) if corpus_field else out
    yield from store.unlisted(audio_only=True)


def iter_shar(folder: Path | str, *, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """A Lhotse Shar directory (or URL prefix): ``cuts.NNNNNN.jsonl(.gz)`` with ``recording.NNNNNN.tar``;
    each cut's audio is the member ``<cut id>.<audio ext>`` of its shard's recording tar."""
    text = os.fspath(folder)
    names = ([storage.name(u) for u, _ in storage.list_prefix(text.rstrip("/") + "/")] if storage.is_url(text)
             else [p.name for p in Path(text).iterdir()])
    cuts = sorted(storage.join(text, n) for n in names if re.fullmatch(r"cuts\.\d+\.jsonl(\.gz)?", n))
    if not cuts:
        raise DataprepError(f"{folder}: no cuts.NNNNNN.jsonl(.gz) files (not a Lhotse Shar directory)")
    tars = [storage.join(text, f"recording.{storage.name(p).split('.')[1]}.tar") for p in cuts]
    # recording tars without their cuts file: every audio member of them ends as unlisted_member
    orphans = sorted(t for n in names if re.fullmatch(r"recording\..*\.tar", n)
                     and (t := storage.join(text, n)) not in tars)
    yield from iter_shar_fields(cuts, tars, chunk_rows=chunk_rows, orphans=orphans)


def iter_shar_fields(cuts: Sequence[str], tars: Sequence[str], *, chunk_rows: int,
                     orphans: Sequence[str] = ()) -> Iterator[pl.DataFrame]:
    """Lhotse Shar by its fields (NeMo's ``shar_path: {cuts: [...], recording: [...]}``): the
    cuts of the i-th cuts file are members of the i-th recording tar (``orphans``: tars without
    cuts, every audio member an ``unlisted_member``); each a path or a store URL."""
    tars = list(tars)
    store = _Tars(tars + list(orphans))
    store.index_urls()
    for si, cut_name in enumerate(cuts):
        cut_file = store_facts.fetch_local(cut_name)
        for frame in relabel(iter_lhotse(cut_file, audio_root=None, chunk_rows=chunk_rows,
                                         source_types=("file", "shar")), str(cut_file), cut_name):
            df = _with_shard_paths(frame.with_columns(pl.lit(si, pl.Int64).alias("__shard")), tars)
            df = _shard_problems(df, tars)
            members = store.members([si]) if _isfile(tars[si]) else store.members([])
            members = members.filter(pl.col("ext").is_in(list(AUDIO_EXTENSIONS))).drop("ext", "base")
            df = _attach_members(df, members, "id", pl.col("__tar"), "stem")
            store.used.setdefault(si, set()).update(df["member"].drop_nulls().to_list())
            yield conform(df, FULL_REJECTS_POLARS_SCHEMA)
    yield from store.unlisted(audio_only=True)


_WDS_LABELS = {"id": "__key__", "audio": "audio member", "offset": "offset", "duration": "duration",
               "sample_rate": "sample_rate", "channels": "channels", "text": ".txt or .json 'text'",
               "lang": "lang", "source_lang": "source_lang", "target_lang": "target_lang", "task": "task"}
_WDS_JSON_FIELDS = {"text": "text", "duration": "duration", "offset": "offset", "lang": "lang",
                    "language": "lang", "source_lang": "source_lang", "target_lang": "target_lang",
                    "task": "task", "taskname": "task", "sample_rate": "sample_rate", "channels": "channels"}


def _json_type(v: object) -> str | None:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "BOOLEAN"
    if isinstance(v, (int, float)):
        return "DOUBLE"
    if isinstance(v, str):
        return "VARCHAR"
    return "ARRAY" if isinstance(v, list) else "OBJECT"


def _wds_keys(idx: TarIndex) -> tuple[dict[str, dict[str, int]], dict[str, tuple[str, str]]]:
    """Group a WebDataset tar's entries by key, in tar order: key -> {extension: member index}
    (the first member of each extension), and key -> (reason, problem) for keys that cannot be
    read as one sample: members not next to each other (``duplicate_key``: the key repeated
    later), a member name, an extension (in any case) or an audio extension given twice
    (``duplicate_member``), a member
    that is not a file (``not_a_file``)."""
    entries = sorted([(p, i, idx.names[i], None) for i, p in enumerate(idx.positions)]
                     + [(p, -1, name, kind) for p, name, kind in idx.others])
    groups: dict[str, dict[str, int]] = {}
    problems: dict[str, tuple[str, str]] = {}
    seen: dict[str, set[str]] = {}
    last = None
    for _, i, name, kind in entries:
        m = _WDS_KEY.match(name)
        key, ext = (m.group(1), m.group(2).lower()) if m else (name, "")
        names = seen.setdefault(key, set())
        if key in groups and key != last:
            problems.setdefault(key, ("duplicate_key", f"key '{key}' appears again later in the tar ({name}): "
                                                       "which members belong to which sample cannot be told"))
        elif name in names:
            problems.setdefault(key, ("duplicate_member", f"member '{name}' appears twice in the tar"))
        elif kind is not None:
            problems.setdefault(key, ("not_a_file", f"member '{name}' is a {kind}, not a file"))
        elif ext in groups.get(key, {}):  # names that differ in case only: one extension twice
            problems.setdefault(key, ("duplicate_member", f"members '{idx.names[groups[key][ext]]}' and '{name}' "
                                                          f"are both its .{ext}: which one is meant cannot be told"))
        names.add(name)
        exts = groups.setdefault(key, {})
        last = key
        if kind is None:
            exts.setdefault(ext, i)
    for key, exts in groups.items():
        audio = [e for e in exts if e.rsplit(".", 1)[-1] in AUDIO_EXTENSIONS]
        if len(audio) > 1:
            problems.setdefault(key, ("duplicate_member", f"key '{key}' has {len(audio)} audio members "
                                                          f"({', '.join(sorted(audio))}): which is its audio cannot be told"))
    return groups, problems


def iter_webdataset(path: Path, *, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """A WebDataset tar: members grouped by key (the name up to the first dot of its file name),
    one row per key: audio = the key's member with an audio extension, text from ``.txt``
    or the ``text`` of ``.json`` (whose ``duration``, ``lang``, ... are read too; other keys go to
    ``extra``). ``origin`` = ``tar:<audio member>`` (or the key's first member).

    Every member is accounted for: a key that is not one clean sample is rejected whole
    (:func:`_wds_keys`); a tar cut short (no end-of-archive block) rejects its last key
    (``truncated_container``: its later members may be lost) and adds one ``truncated_container``
    row for the tar (keys after the cut are unknown)."""
    idx = index_tar(path)
    if idx.problem and not idx.names and not idx.others:
        raise DataprepError(f"{path}: {idx.problem}")
    tar_abs = _abs(path)
    groups, problems = _wds_keys(idx)
    if idx.problem is not None and groups:
        last = next(reversed(groups))
        problems.setdefault(last, ("truncated_container", f"the last key before the tar's cut ({idx.problem}): "
                                                          "its later members may be lost"))
    if storage.is_url(os.fspath(path)):  # the text members, coalesced range reads in parallel
        want = [i for exts in groups.values() for e in ("txt", "json") if (i := exts.get(e)) is not None
                and idx.names[i] not in idx.truncated]
        held = dict(zip(want, storage.read_ranges(os.fspath(path), [(idx.offsets[i], idx.sizes[i]) for i in want])))
        fd, read = -1, held.__getitem__
    else:
        fd = os.open(path, os.O_RDONLY)
        read = lambda i: read_range(fd, idx.offsets[i], idx.sizes[i])  # noqa: E731
    try:
        rows: list[dict[str, object]] = []
        for key, exts in groups.items():
            row = _wds_row(read, idx, str(path), tar_abs, key, exts)
            if key in problems and not (problems[key][0] == "truncated_container" and row.get("reason")):
                reason, detail = problems[key]
                row["reason"], row["detail"] = reason, f"{row['origin']}: {detail}"
            rows.append(row)
            if len(rows) >= chunk_rows:
                yield _wds_frame(rows, path)
                rows = []
        if rows:
            yield _wds_frame(rows, path)
    finally:
        if fd >= 0:
            os.close(fd)
    if idx.problem is not None or idx.trailing is not None:
        yield _container_rejects(TarIndex(idx.path, problem=idx.problem, trailing=idx.trailing))


def _wds_row(read: Callable[[int], bytes], idx: TarIndex, tar: str, tar_abs: str, key: str,
             exts: dict[str, int]) -> dict[str, object]:
    """The raw row (value + type columns, reason) of one WebDataset key (``read(i)``: member i's bytes)."""
    audio = next((exts[e] for e in exts if e.rsplit(".", 1)[-1] in AUDIO_EXTENSIONS), None)
    first = audio if audio is not None else min(exts.values(), default=None)
    origin = f"{tar}:{idx.names[first] if first is not None else key}"  # a key of links only: its name
    row: dict[str, object] = {"origin": origin, "id": key, "id__t": "VARCHAR"}
    problem: tuple[str, str] | None = None
    extra: dict[str, object] = {}
    for ext in ("txt", "json"):
        if ext not in exts:
            continue
        i = exts[ext]
        if idx.names[i] in idx.truncated:
            problem = problem or ("truncated_member", f"{origin}: {idx.names[i]}: member data runs past the end of the tar")
            continue
        raw = read(i)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            problem = problem or ("non_utf8", f"{origin}: {idx.names[i]} is not UTF-8 ({exc.reason})")
            continue
        if ext == "txt":
            row["text"], row["text__t"] = text.strip(), "VARCHAR"
            continue
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            problem = problem or ("malformed_line", f"{origin}: {idx.names[i]} is not a JSON object ({exc})")
            continue
        for k, v in obj.items():
            field = _WDS_JSON_FIELDS.get(k)
            if field is None or (field == "text" and "text__t" in row):
                extra[k] = v
            elif f"{field}__t" not in row:
                row[field] = v if isinstance(v, str) or v is None else json.dumps(v)
                row[f"{field}__t"] = _json_type(v)
    if audio is None:
        problem = problem or ("missing_audio", f"{origin}: key '{key}' has no audio member ({', '.join(sorted(exts))})")
    else:
        name = idx.names[audio]
        row.update(audio=name, audio__t="VARCHAR", container=tar_abs, member_offset=idx.offsets[audio],
                   member_size=idx.sizes[audio])
        if name in idx.truncated:
            problem = ("truncated_member", f"{origin}: member data runs past the end of the tar (truncated)")
        elif "text__t" not in row:
            problem = problem or ("missing_field", f"{origin}: key '{key}' has audio but no text (.txt or .json 'text')")
    if problem:
        row["reason"], row["detail"] = problem
    row["extra"] = json.dumps(extra, sort_keys=True, ensure_ascii=False) if extra else None
    return row


def _wds_frame(rows: list[dict[str, object]], path: Path) -> pl.DataFrame:
    schema: dict[str, pl.DataType] = {"origin": pl.String(), "reason": pl.String(), "detail": pl.String(),
                                      "extra": pl.String(), "container": pl.String(), "member_offset": pl.Int64(),
                                      "member_size": pl.Int64()}
    for f in FIELDS:
        schema[f] = pl.String()
        schema[f"{f}__t"] = pl.String()
    raw = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    out = finish(raw, base_dir=storage.parent(path) if storage.is_url(os.fspath(path)) else str(path.parent.resolve()),
                 labels=_WDS_LABELS, require_audio=False)
    c = raw.select("container", "member_offset", "member_size",
                   (pl.col("container") + pl.lit(":") + pl.col("audio")).alias("audio_path"))
    out = out.with_columns(c.get_columns())
    return conform(out, FULL_REJECTS_POLARS_SCHEMA)


def is_hf_audio(schema: pa.Schema) -> bool:
    """Whether a Parquet schema has Hugging Face's ``audio`` struct (``bytes`` and ``path``)."""
    if "audio" not in schema.names:
        return False
    t = schema.field("audio").type
    return pa.types.is_struct(t) and t.get_field_index("bytes") >= 0


def iter_hf_parquet(path: Path, *, text_field: str, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """A Hugging Face audio Parquet: ``audio`` = struct(``bytes``, ``path``); text in ``text_field``,
    else ``text``, ``sentence`` or ``transcription``; other columns as for Parquet (the struct's
    ``path`` goes to ``extra`` as ``audio_path``). ``id``: the ``id`` column, else the struct's
    ``path``, else ``<file>:<row>``. Rows come per row group in chunks of about
    :data:`HF_CHUNK_BYTES` of audio, with ``__audio_bytes`` for the header probe."""
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 (pyarrow raises several types)
        raise DataprepError(f"{path}: not a readable Parquet file ({exc})") from None
    names = [n for n in pf.schema_arrow.names if n != "audio"]
    text_col = next((c for c in (text_field, *HF_TEXT_COLUMNS) if c in names), None)
    if text_col is None:
        raise DataprepError(f"{path}: no text column ('{text_field}', {', '.join(HF_TEXT_COLUMNS)}; "
                            f"columns: {', '.join(pf.schema_arrow.names)})")
    mapping = column_map(names, text_col, str(path))
    mapping.pop("audio", None)
    derive_id = "id" not in mapping
    if derive_id:
        mapping["id"] = "__id"
    file_abs = _abs(path)
    row = 0
    for rg in range(pf.num_row_groups):
        meta = pf.metadata.row_group(rg)
        per_row = max(1, meta.total_byte_size // max(1, meta.num_rows))
        batch_rows = max(1, min(chunk_rows, HF_CHUNK_BYTES // per_row))
        in_group = 0
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[rg]):
            audio = batch.column("audio")
            audio_bytes = pl.from_arrow(audio.field("bytes")).cast(pl.Binary)  # type: ignore[union-attr]
            audio_name = (pl.from_arrow(audio.field("path")) if audio.type.get_field_index("path") >= 0  # type: ignore[union-attr]
                          else pl.Series([None] * batch.num_rows, dtype=pl.String))
            df = pl.from_arrow(pa.Table.from_batches([batch]).drop_columns(["audio"]))
            assert isinstance(df, pl.DataFrame)
            n = df.height
            origin = pl.format("{}:{}", pl.lit(str(path)), pl.int_range(row + 1, row + 1 + n))
            # the struct's path is kept in ``extra`` (as ``audio_path``)
            df = df.with_columns(origin.alias("origin"), pl.Series("audio_path", audio_name, dtype=pl.String))
            if derive_id:
                df = df.with_columns(pl.coalesce(pl.col("audio_path"), pl.col("origin")).alias("__id"))
            types = {c: _type_name(df.schema[c]) for c in df.columns}
            raw = _raw_from_columns(df, mapping, types)
            labels = _labels(mapping)
            labels["audio"] = "audio.bytes"
            out = finish(raw, base_dir=str(path.parent.resolve()), labels=labels, require_audio=False)
            out = out.with_columns(
                pl.lit(file_abs).alias("container"),
                pl.lit(rg, pl.Int32).alias("row_group"),
                pl.int_range(in_group, in_group + n, dtype=pl.Int64).alias("group_row"),
                pl.format("{}:{}", pl.lit(file_abs), pl.int_range(row + 1, row + 1 + n)).alias("audio_path"),
            )
            out = _set_problem(out, pl.lit(audio_bytes.is_null()), "missing_audio",
                               pl.lit("audio struct has null bytes"))
            out = conform(out, FULL_REJECTS_POLARS_SCHEMA).with_columns(audio_bytes.alias("__audio_bytes"))
            row += n
            in_group += n
            yield out
