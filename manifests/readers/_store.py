"""Sources in a store made of several small files: a Kaldi data folder, a Lhotse recipe's
supervisions with their recordings (a file or its folder), and an ``input_cfg`` YAML.

Their text files are copied locally once (:func:`manifests.store_facts.fetch_local`, cached by
ETag) into a temporary folder under their store names and read there; rows name the URLs, never
the copies (``origin``, ``detail``), relative audio paths resolve against the URL's folder and
the audio stays in the store (probed in place). A YAML's relative entries resolve against its
URL's folder. Lhotse Shar folders, NeMo tarred sets and WebDataset tars are read in place
(:mod:`manifests.readers._containers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from manifests import storage, store_facts
from manifests.errors import DataprepError
from manifests.readers._blend import Blend, read_blend as read_blend_file
from manifests.readers._normalize import relabel

#: the files of a Kaldi data folder the reader reads
KALDI_FILES = ("wav.scp", "text", "segments", "utt2dur", "utt2lang", "utt2spk")


@contextlib.contextmanager
def _staged(urls: dict[str, str]) -> Iterator[Path]:
    """A temporary folder holding each ``name -> URL`` object's local copy under ``name``."""
    with tempfile.TemporaryDirectory(prefix="dataprep-store-src.") as tmp:
        for name, url in urls.items():
            src, dest = store_facts.fetch_local(url), Path(tmp) / name
            try:
                os.link(src, dest)
            except OSError:
                import shutil
                shutil.copyfile(src, dest)
        yield Path(tmp)


def partner_name(name: str) -> str:
    """The recordings file of a Lhotse supervisions file (or the reverse), by Lhotse's naming."""
    return name.replace("supervisions", "recordings") if "supervisions" in name else name.replace("recordings", "supervisions")


def _top_level(url: str) -> dict[str, str]:
    """``name -> URL`` of the objects directly under the folder ``url``."""
    prefix = url.rstrip("/") + "/"
    return {u[len(prefix):]: u for u, _ in storage.list_prefix(prefix) if "/" not in u[len(prefix):]}


def iter_url_files(url: str, fmt: str, *, audio_root: str | Path | None, chunk_rows: int) -> Iterator[pl.DataFrame] | None:
    """The rows of a Kaldi folder or a Lhotse recipe (its folder, or a supervisions file) at
    ``url``; ``None`` when ``url`` is neither (another reader's)."""
    from manifests.readers._jsonl import iter_lhotse_recipe
    from manifests.readers._kaldi import iter_kaldi

    folder = storage.exists(url) is False
    names = _top_level(url) if folder else {}
    base = url.rstrip("/") if folder else storage.parent(url)
    root = audio_root if audio_root is not None else base
    if folder and fmt in ("auto", "kaldi") and "wav.scp" in names:
        files = {n: names[n] for n in KALDI_FILES if n in names}

        def kaldi() -> Iterator[pl.DataFrame]:
            with _staged(files) as d:
                yield from relabel(iter_kaldi(d, audio_root=root, chunk_rows=chunk_rows), str(d), base)
        return kaldi()
    if folder:
        sups = sorted(n for n in names if "supervisions" in n and ".jsonl" in n and partner_name(n) in names)
    elif "supervisions" in storage.name(url) and fmt in ("auto", "lhotse-recipe"):
        sups = [storage.name(url)]
        names = {sups[0]: url, partner_name(sups[0]): storage.join(base, partner_name(sups[0]))}
        if not storage.exists(names[partner_name(sups[0])]):
            raise DataprepError(f"{url}: a Lhotse supervisions manifest without its recordings beside it "
                                f"({names[partner_name(sups[0])]})")
    else:
        return None
    if not sups or fmt not in ("auto", "lhotse-recipe"):
        return None

    def recipe() -> Iterator[pl.DataFrame]:
        with _staged({n: names[n] for s in sups for n in (s, partner_name(s))}) as d:
            for s in sups:
                yield from relabel(iter_lhotse_recipe(d / s, d / partner_name(s), audio_root=root,
                                                      chunk_rows=chunk_rows), str(d), base)
    return recipe()


def read_blend(path: str | os.PathLike[str]) -> Blend:
    """:func:`manifests.readers._blend.read_blend` of a local file or a URL (its local copy
    parsed; entries relative to it resolved against the URL's folder, the blend named by URL)."""
    text = os.fspath(path)
    if not storage.is_url(text):
        return read_blend_file(path)
    if not storage.exists(text):
        raise DataprepError(f"{text}: no such object")
    local = store_facts.fetch_local(text)
    blend = read_blend_file(local)
    here, there = str(local.parent) + "/", storage.parent(text) + "/"

    def rebase(paths: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(there + p[len(here):] if p.startswith(here) else p for p in paths)

    leaves = tuple(dataclasses.replace(leaf, paths=rebase(leaf.paths), tars=rebase(leaf.tars)) for leaf in blend.leaves)
    warnings = tuple(w.replace(str(local), text) for w in blend.warnings)
    return dataclasses.replace(blend, path=text, leaves=leaves, warnings=warnings)
