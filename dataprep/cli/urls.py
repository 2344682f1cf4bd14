"""Store URLs (``s3://``, ``gs://``, ``az://``) in the path arguments of every command.

A command's ``Path`` argument that names a URL (typer hands it over as ``s3:/bucket/key``; the
lost slash is put back) is replaced, for the command's run, by a local stand-in: an input
object by its local copy (:func:`manifests.store_facts.fetch_local`, cached by ETag; a folder's
objects each so) under its own name, an output by a path in a staging folder that stands for
the URL's folder. After the command succeeds, everything it wrote there is uploaded whole
(:func:`manifests.storage.upload`): data files first, JSON files (a plan's ``plan.json``, a
pack's marker) after them and the output itself last, so nothing looks complete before it is;
a folder output's old JSON files are removed first and objects the new run did not write
after. On an error nothing is uploaded. Commands that read a URL themselves (``compile``,
``train-tokenizer``: audio probed in place) take ``str`` arguments and are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any

from manifests.errors import DataprepError

_MANGLED = re.compile(r"^(s3|s3a|gs|gcs|az|azure|abfs|abfss):/(?!/)")
#: parameters that name what a command writes
OUTPUTS = frozenset({"output", "out_dir", "rejects", "json_out", "plots"})
#: parameters that must stay local (a checkpoint folder, a cache)
LOCAL_ONLY = frozenset({"checkpoint_dir", "cache_dir"})


def _url(value: Any) -> str | None:
    if isinstance(value, PurePath) and _MANGLED.match(str(value)):
        return re.sub(r"^([a-z0-9]+):/", r"\1://", str(value))
    return None


def _link(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        import shutil
        shutil.copyfile(src, dest)


def _local_input(url: str, folder: Path) -> Path:
    """A local copy of the object or folder ``url`` under ``folder``, named as in the store."""
    from manifests import storage, store_facts

    dest = folder / storage.name(url)
    if storage.exists(url):
        _link(store_facts.fetch_local(url), dest)
        return dest
    prefix = url.rstrip("/") + "/"
    objects = storage.list_prefix(prefix)
    if not objects:
        raise DataprepError(f"{url}: no such object or folder")
    for obj, _ in objects:
        _link(store_facts.fetch_local(obj), dest / obj[len(prefix):])
    return dest


def _upload(folder: Path, parent_url: str, primary: Path, say: Callable[[str], None]) -> None:
    """Upload what a command wrote into ``folder`` (standing for ``parent_url``), ``primary`` last."""
    from manifests import storage

    files = [p for p in folder.rglob("*") if p.is_file()]
    url_of = {p: storage.join(parent_url, p.relative_to(folder).as_posix()) for p in files}
    old: list[str] = []
    if primary.is_dir():
        old = [u for u, _ in storage.list_prefix(storage.join(parent_url, primary.name) + "/")]
        for u in old:
            if u.endswith(".json"):
                storage.remove(u)  # the old run's markers go first: nothing looks complete meanwhile
    last = sorted((p for p in files if p.suffix == ".json" or p == primary), key=lambda p: (p == primary, str(p)))
    for p in sorted(set(files) - set(last), key=str):
        storage.upload(p, url_of[p])
    for u in set(old) - set(url_of.values()):
        storage.remove(u)  # what the old run wrote and this one did not
    for p in last:
        storage.upload(p, url_of[p])
    if files:
        say(f"uploaded {len(files)} file(s) -> {storage.join(parent_url, primary.name)}"
            + (f" (and {len(files) - 1} beside it)" if not primary.is_dir() and len(files) > 1 else ""))


@contextlib.contextmanager
def url_arguments(kwargs: dict[str, Any], say: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
    """``kwargs`` with every URL argument replaced by its local stand-in; outputs uploaded on success.
    What an earlier command in this process learnt of objects is forgotten first."""
    import sys
    if "manifests.storage" in sys.modules:
        sys.modules["manifests.storage"].forget_all()
    urls = {k: u for k, v in kwargs.items() if (u := _url(v)) is not None}
    listed = {k: [_url(x) or x for x in v] for k, v in kwargs.items()
              if isinstance(v, list) and any(_url(x) for x in v)}
    if not urls and not listed:
        yield kwargs
        return
    from manifests import storage

    with tempfile.TemporaryDirectory(prefix="dataprep-urls.") as tmp:
        new = dict(kwargs)
        uploads: list[tuple[Path, str, Path]] = []
        for i, (k, url) in enumerate(urls.items()):
            if k in LOCAL_ONLY:
                raise DataprepError(f"{url}: --{k.replace('_', '-')}: must be a local folder")
            folder = Path(tmp) / f"{i}"
            if k in OUTPUTS:
                folder.mkdir()
                new[k] = folder / storage.name(url)
                uploads.append((folder, storage.parent(url), new[k]))
            else:
                new[k] = _local_input(url, folder)
        for k, values in listed.items():
            new[k] = [_local_input(v, Path(tmp) / f"{k}-{j}") if isinstance(v, str) else v
                      for j, v in enumerate(values)]
        try:
            yield new
        except DataprepError as exc:  # the line names the URL, never its local stand-in
            text = str(exc)
            for k, url in urls.items():
                text = text.replace(str(new[k]), url)
            if text == str(exc):
                raise
            raise DataprepError(text) from None
        for folder, parent_url, primary in uploads:
            _upload(folder, parent_url, primary, say)
