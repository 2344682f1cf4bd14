"""Local paths and store URLs as strings: which is which, joined, split and resolved without
mangling (``s3://b/x``, never ``s3:/b/x``). A URL is ``SCHEME://BUCKET/KEY`` with a scheme of
:data:`SCHEMES`; ``file://`` is a local path. No I/O; :class:`StoreError` is the error of every
store call (all re-exported by :mod:`manifests.storage`).
"""

from __future__ import annotations

import os
import re

from manifests.errors import DataprepError


class StoreError(DataprepError, OSError):
    """An object could not be read or written (after the last retry): one line naming it."""


#: URL schemes read through the object store (``file://`` is a local path)
SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss"})
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an object in a store (``s3://``, ``gs://``, ``az://``, ``abfs://``);
    a local path and ``file://`` are not URLs."""
    m = _URL.match(os.fspath(path)) if isinstance(path, str) else None
    return bool(m) and m.group(1).lower() in SCHEMES


def local_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a local path (``file:///x`` -> ``/x``); a URL is returned unchanged."""
    text = os.fspath(path)
    return text[len("file://"):] if isinstance(text, str) and text.startswith("file://") else text


def split_url(url: str) -> tuple[str, str]:
    """``(root, key)`` of a URL: ``s3://bucket/a/b`` -> (``s3://bucket``, ``a/b``)."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StoreError(f"{url}: no bucket in the URL (expected {scheme}://BUCKET/KEY)")
    return f"{scheme.lower()}://{bucket}", key


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """``base`` / ``parts`` for a URL or a local path (never mangles ``s3://`` into ``s3:/``)."""
    text = os.fspath(base)
    if not is_url(text):
        return os.path.join(local_path(text), *parts)
    out = text.rstrip("/")
    for p in parts:
        out = p if is_url(p) else f"{out}/{p.strip('/')}" if p.strip("/") else out
    return out


def parent(path: str | os.PathLike[str]) -> str:
    """The folder holding ``path`` (a URL's parent prefix, never above its bucket)."""
    text = os.fspath(path)
    if not is_url(text):
        return os.path.dirname(local_path(text)) or "."
    root, key = split_url(text)
    head = key.rstrip("/").rpartition("/")[0]
    return f"{root}/{head}" if head else root


def name(path: str | os.PathLike[str]) -> str:
    """The last component of ``path``."""
    return os.fspath(path).rstrip("/").rpartition("/")[2] if is_url(path) else os.path.basename(local_path(path))


def resolve(base_dir: str | os.PathLike[str], path: str) -> str:
    """``path`` as given when absolute or a URL, else under ``base_dir`` (a folder or URL)."""
    if is_url(path) or os.path.isabs(local_path(path)):
        return local_path(path)
    return join(base_dir, path)
