"""NeMo's bucketing options as a bucket file: read them as buckets, write buckets as them.

NeMo (Lhotse dataloader) keeps buckets in its ``train_ds`` options (the YAML NeMo's
``estimate_duration_bins(_2d).py``, OOMptimizer and our ``export nemo`` print):
``bucket_duration_bins`` (2D ``[[max s, max tokens], ...]`` or 1D) and ``bucket_batch_size``
or ``batch_duration``, read at the top level or under ``train_ds`` / ``model.train_ds`` as NeMo
reads YAML (:mod:`manifests.nemo_yaml`). A token bound of 2**31 - 1 or more is unbounded.
``batch_duration`` sizes a bucket as its longest clips fit (``d + d**2 / quadratic_duration``).
``use_multimodal_sampling: true``: a bin is ``[audio tokens, text tokens]`` (``max_duration`` =
audio tokens x ``token_equivalent_duration``) and ``batch_tokens`` sizes a batch as lhotse's
``TokenConstraint``: ``floor(batch_tokens / (te + te**2 / quadratic_factor))``, ``te`` the
bounds summed (:mod:`bucketing.token_equivalents`' formula). ``max_tps``, the origin and the
keys not used (:func:`not_used`) go in the ``fit`` record of :func:`nemo_to_buckets_json`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from manifests.atomic_files import atomic_path
from manifests.errors import OptionError
from manifests.nemo_yaml import load_nemo_yaml
from manifests.validation import Validator

#: a token bound at or above this reads as unbounded (what a bucket without max_tokens exports as)
UNBOUNDED_TOKENS = (1 << 31) - 1
#: keys of the options this reader uses; the others of a train_ds (num_workers...) are named by :func:`not_used`
USED_KEYS = {"bucket_duration_bins", "bucket_batch_size", "num_buckets", "batch_duration", "quadratic_duration",
             "use_multimodal_sampling", "token_equivalent_duration", "batch_tokens", "quadratic_factor",
             "measure_total_length"}
#: NeMo batching options a buckets file does not carry (a plan's batches come from the buckets)
BATCHING_KEYS = ("use_bucketing", "batch_size", "max_duration", "max_tps", "min_duration", "min_tps", "max_tokens",
                 "min_tokens", "bucket_buffer_size", "shuffle_buffer_size", "concurrent_bucketing",
                 "bucketing_2d_strict_mode", "bucket_duration_bins_estimate", "num_cuts_for_bins_estimate", "shuffle", "seed", "shard_seed")
#: suffixes of a NeMo options file (anything else is read as buckets.json)
YAML_SUFFIXES = (".yaml", ".yml")


def is_nemo_buckets_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a NeMo YAML options file (by suffix)."""
    return Path(path).suffix.lower() in YAML_SUFFIXES


def buckets_format(path: str | os.PathLike[str], fmt: str | None = None) -> str:
    """The format a buckets file at ``path`` is written in, as every reader picks it: ``nemo``
    (bucketing YAML) for a ``.yaml`` / ``.yml`` name, else ``json``. A ``fmt`` given must agree
    (:class:`~manifests.errors.OptionError` on ``format`` otherwise)."""
    by_suffix = "nemo" if is_nemo_buckets_path(path) else "json"
    if fmt is not None and fmt != by_suffix:
        want = "a .yaml name" if fmt == "nemo" else "a name not ending in .yaml / .yml"
        raise OptionError("format", f"{fmt} does not match {Path(path).name!r}, which readers take for "
                                    f"{'NeMo bucketing YAML' if by_suffix == 'nemo' else 'buckets.json'} "
                                    f"by its suffix; give {want} or --format {by_suffix}")
    return by_suffix


def _options(v: Validator, obj: Any) -> dict[str, Any]:
    """The mapping holding ``bucket_duration_bins`` (top level, ``train_ds``, ``model.train_ds``)."""
    obj = v.obj(obj, "(file)")
    found = None
    for path in ((), ("train_ds",), ("model", "train_ds")):
        node: Any = obj
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and "bucket_duration_bins" in node:
            return node
        if isinstance(node, dict) and found is None and "batch_duration" in node:
            found = node
    if found is not None:  # NeMo estimates the bins at start-up from the data
        n = found.get("num_buckets", 30)
        raise v.fail("bucket_duration_bins", f"missing: NeMo estimates them from the data at start-up (num_buckets "
                                             f"{n}); fit them here: dataprep fit-buckets MANIFEST --num-buckets {n} "
                                             f"--max-duration-budget {found['batch_duration']} -o buckets.json")
    raise v.fail("bucket_duration_bins", "missing (looked at the top level, train_ds and model.train_ds)")


def not_used(obj: Any) -> list[str]:
    """The keys of NeMo bucketing options (:func:`_options`' mapping) a plan does not apply, NeMo's
    batching options first (a plan's batches come from its buckets; ``max_tps`` is kept in the
    ``fit`` record only; ``use_bucketing: true`` is what a plan does)."""
    opts = _options(Validator("(options)"), obj)
    named = [k for k in BATCHING_KEYS if k in opts and not (k == "use_bucketing" and opts[k] is True)]
    if opts.get("use_multimodal_sampling") is not True:  # NeMo ignores them then; so does a plan
        named += [k for k in ("token_equivalent_duration", "batch_tokens", "quadratic_factor", "measure_total_length")
                  if k in opts]
    return named + sorted(
        str(k) for k in opts if k not in USED_KEYS and k not in BATCHING_KEYS and not isinstance(opts[k], dict))


def multimodal_options(v: Validator, opts: dict[str, Any]) -> dict[str, Any] | None:
    """NeMo's multimodal sampling options (None without ``use_multimodal_sampling: true``):
    ``token_equivalent_duration`` (s per token, required), ``batch_tokens``, ``quadratic_factor``;
    ``measure_total_length: false`` is refused (a row's token-equivalents count its prompt and
    answer tokens: NeMo's default, true)."""
    mm = opts.get("use_multimodal_sampling")
    if mm is None or mm is False:
        return None
    if mm is not True:
        raise v.fail("use_multimodal_sampling", f"expected true or false, got {mm!r}")
    out: dict[str, Any] = {"token_equivalent_duration": v.number(
        v.key(opts, "token_equivalent_duration", ""), "token_equivalent_duration", positive=True)}
    if opts.get("batch_tokens") is not None:
        out["batch_tokens"] = v.int_(opts["batch_tokens"], "batch_tokens", lo=1)
    if opts.get("quadratic_factor") is not None:
        out["quadratic_factor"] = v.number(opts["quadratic_factor"], "quadratic_factor", positive=True)
    total = opts.get("measure_total_length", True)
    if total is not True:
        raise v.fail("measure_total_length", f"{total!r} is not read: a row's token-equivalents count its prompt "
                                             "and answer tokens with its audio (true, NeMo's default)")
    return out


def nemo_to_buckets_json(obj: Any, where: str = "bucketing.yaml") -> dict[str, Any]:
    """A ``buckets.json`` object from decoded NeMo bucketing options; field-by-field checks,
    no coercion, one-line ``FILE: field: problem`` errors."""
    v = Validator(where)
    opts = _options(v, obj)
    bins = v.list_(opts["bucket_duration_bins"], "bucket_duration_bins")
    if not bins:
        raise v.fail("bucket_duration_bins", "empty; expected at least one bin")
    two_d = isinstance(bins[0], list)
    mm = multimodal_options(v, opts)
    if mm is not None and not two_d:
        raise v.fail("bucket_duration_bins", "1D bins with use_multimodal_sampling bound a row's token-equivalents, "
                                             "not its audio and its tokens: give 2D bins [audio tokens, text tokens] "
                                             "(or fit them: dataprep fit-buckets)")
    buckets: list[dict[str, Any]] = []
    for i, b in enumerate(bins):
        name = f"bucket_duration_bins[{i}]"
        if two_d:
            pair = v.list_(b, name)
            if len(pair) != 2:
                raise v.fail(name, f"expected [max_duration, max_tokens], got {len(pair)} values")
            d = v.number(pair[0], f"{name}[0]", positive=True)
            if mm is not None:  # audio tokens (NeMo's ceil(duration / token_equivalent_duration)) as seconds
                d = d * mm["token_equivalent_duration"]
            t = v.number(pair[1], f"{name}[1]", lo=1)
            if t != int(t):
                raise v.fail(f"{name}[1]", f"expected a whole number of tokens, got {pair[1]!r}")
            buckets.append({"index": i, "max_duration": d, **({} if t >= UNBOUNDED_TOKENS else {"max_tokens": int(t)})})
        else:
            if isinstance(b, list):
                raise v.fail(name, "a pair in a 1D list (every bin must be [s, tokens] or every bin a number)")
            buckets.append({"index": i, "max_duration": v.number(b, name, positive=True)})
    source: dict[str, Any] = {}
    if opts.get("bucket_batch_size") is not None:
        raw = v.list_(opts["bucket_batch_size"], "bucket_batch_size")
        if len(raw) != len(buckets):
            raise v.fail("bucket_batch_size", f"{len(raw)} sizes for {len(buckets)} bins")
        for i, (bucket, size) in enumerate(zip(buckets, raw)):
            bucket["batch_size"] = v.int_(size, f"bucket_batch_size[{i}]", lo=1)
        source = {"rule": "nemo bucket_batch_size", "file": Path(where).name}
    elif mm is not None and mm.get("batch_tokens") is not None:
        budget_t, q = mm["batch_tokens"], mm.get("quadratic_factor")
        for bucket, pair in zip(buckets, bins):
            if bucket.get("max_tokens") is None:
                raise v.fail(f"bucket_duration_bins[{bucket['index']}][1]", "unbounded: batch_tokens sizes a batch "
                                                                         "by its rows' largest tokens")
            te = float(pair[0]) + bucket["max_tokens"]  # the bin's audio tokens + text tokens
            cost = te + (te * te / q if q else 0.0)  # lhotse TokenConstraint: n x cost <= batch_tokens
            size = int(budget_t // cost)
            size = size + 1 if (size + 1) * cost <= budget_t else size
            if size < 1:
                raise v.fail("batch_tokens", f"{budget_t} token-equivalents hold no row of bucket {bucket['index']} "
                                             f"(up to {te:g}{', quadratic' if q else ''})")
            bucket["batch_size"] = size
        source = {"rule": "nemo batch_tokens", "file": Path(where).name, **mm}
    elif mm is not None and opts.get("batch_duration") is not None:
        raise v.fail("batch_duration", "not read with use_multimodal_sampling (NeMo sizes batches by batch_tokens "
                                       "then): give batch_tokens or bucket_batch_size")
    elif opts.get("batch_duration") is not None:
        budget = v.number(opts["batch_duration"], "batch_duration", positive=True)
        q = None if opts.get("quadratic_duration") is None else v.number(opts["quadratic_duration"],
                                                                         "quadratic_duration", positive=True)
        for bucket in buckets:
            d = bucket["max_duration"]
            size = int(budget // (d + (d * d / q if q else 0.0)))
            if size < 1:
                raise v.fail("batch_duration", f"{budget:g} s holds no clip of bucket {bucket['index']} "
                                               f"(up to {d:g} s{', quadratic' if q else ''})")
            bucket["batch_size"] = size
        source = {"rule": "nemo batch_duration", "file": Path(where).name, "batch_duration": budget,
                  **({"quadratic_duration": q} if q else {})}
    if opts.get("num_buckets") is not None and v.int_(opts["num_buckets"], "num_buckets") != len(buckets):
        raise v.fail("num_buckets", f"is {opts['num_buckets']} but bucket_duration_bins has {len(buckets)} bins")
    fit: dict[str, Any] = {"source": "nemo bucket_duration_bins", "file": Path(where).name,
                           **({"token_equivalent_duration": mm["token_equivalent_duration"]} if mm else {})}
    max_tps = opts.get("max_tps")
    if isinstance(max_tps, list):
        fit["max_tps"] = [v.number(x, f"max_tps[{i}]", positive=True) for i, x in enumerate(max_tps)]
    elif max_tps is not None:
        fit["max_tps"] = v.number(max_tps, "max_tps", positive=True)
    unused = not_used(obj)
    if unused:
        fit["not_used"] = unused
    return {"version": 1, "buckets": buckets, "batch_size_source": source, "fit": fit}


def read_nemo_options(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A NeMo bucketing YAML file as a ``buckets.json`` object (validate it with ``parse_buckets``)."""
    return nemo_to_buckets_json(load_nemo_yaml(path), str(path))


def token_equivalent_duration(path: str | os.PathLike[str]) -> float | None:
    """The ``token_equivalent_duration`` (s per token) of a NeMo bucketing YAML with
    ``use_multimodal_sampling: true``; None for buckets.json or without multimodal sampling."""
    if not is_nemo_buckets_path(path):
        return None
    return read_nemo_options(path)["fit"].get("token_equivalent_duration")


def nemo_options_warnings(path: str | os.PathLike[str]) -> list[str]:
    """One line naming the keys of a NeMo bucketing YAML a plan does not use (none for buckets.json)."""
    if not is_nemo_buckets_path(path):
        return []
    unused = read_nemo_options(path)["fit"].get("not_used", [])
    return [f"{path}: not used by dataprep (NeMo loader options; a plan's batches come from the buckets): "
            + ", ".join(unused)] if unused else []


def nemo_bucket_options(buckets: Sequence[Mapping[str, Any]], max_tps: float | None = None) -> dict[str, Any]:
    """NeMo's bucketing options for ``buckets`` (``buckets.json``'s list): 2D bins when any
    bucket bounds tokens, else 1D; ``bucket_batch_size`` when every bucket has a size."""
    if any(b.get("max_tokens") is not None for b in buckets):
        bins: list[Any] = [[float(b["max_duration"]), int(b.get("max_tokens") or UNBOUNDED_TOKENS)] for b in buckets]
    else:
        bins = [float(b["max_duration"]) for b in buckets]
    out: dict[str, Any] = {"use_bucketing": True, "num_buckets": len(buckets), "bucket_duration_bins": bins}
    if all(b.get("batch_size") is not None for b in buckets):
        out["bucket_batch_size"] = [int(b["batch_size"]) for b in buckets]
    if max_tps is not None:
        out["max_tps"] = float(max_tps)
    return out


def write_nemo_buckets(buckets: Sequence[Mapping[str, Any]], path: str | os.PathLike[str],
                       max_tps: float | None = None) -> None:
    """Write ``buckets`` (``buckets.json``'s list) as NeMo bucketing YAML atomically (each bin one line)."""
    import yaml

    buckets_format(path, "nemo")
    text = yaml.safe_dump(nemo_bucket_options(buckets, max_tps), default_flow_style=None, sort_keys=False,
                          width=1 << 30)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
