"""Output safety, one set of rules for every command.

- :func:`refuse_same_paths`: an output may not be an input, a file an input expands to
  (:func:`input_files`: a blend's corpora and tars, a folder's files, a brace pattern's
  members) nor another output; by real path (links followed) and inode (hard links). A block
  device or socket is refused (devices, pipes, stdout: written through, ``output_kind``).
- :func:`refuse_folder_over_inputs`: an output folder may not hold (at any depth, links
  resolved) a file the command reads, nor be an input's folder.
- :func:`require_replaceable_plan_dir` / :func:`require_free_checkpoint_dir`: a plan directory
  is replaced only when it holds nothing but a plan's files; a checkpoint directory holding a
  run needs ``--resume`` or ``--overwrite``.
- :func:`publish_together`: a manifest and its rejects together or not at all (:func:`staged`: URLs).
- temporary files and folders carry the writer's pid (``temp_prefix``): removed on every exit
  path, and by the next run after a kill (:func:`manifests.atomic_files.sweep_stale_temps`).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from manifests.atomic_files import atomic_path, output_kind
from manifests.errors import DataprepError, ManifestError, OutputError

PathLike = str | os.PathLike[str]
_PLAN_FILE = re.compile(r"^(plan\.json|rank-\d{5}\.parquet)$")
#: files a training run leaves in its checkpoint directory
RUN_FILES = re.compile(r"^(last\.pt|log\.jsonl|(skipped|trace)-rank-\d{5}\.jsonl)$")


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _folder_files(folder: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(str(p) for p in folder.iterdir() if p.is_file())
    return []


def input_files(path: PathLike) -> list[str]:
    """The files reading the input ``path`` opens besides ``path`` itself: a folder's files (a
    Kaldi data dir, Lhotse Shar or recipe folder, a plan, parts), the recordings manifest of a
    Lhotse supervisions manifest, an ``input_cfg`` blend's
    corpora (manifests, tars, Shar folders' files; brace patterns expanded), a brace pattern's
    members (``audio__OP_0..7_CL_.tar``). A blend that cannot be read gives only itself here
    (its reader reports it)."""
    from manifests.containers import expand_paths
    from manifests.readers import is_blend_path, read_blend

    p = Path(path)
    text = os.fspath(path)
    if ("_OP_" in text or "{" in text) and not p.exists():
        try:
            return [x for x in expand_paths([text]) if x != text]
        except DataprepError:
            return []  # not a pattern its reader takes: the reader says so
    if p.is_dir():
        return _folder_files(p)
    if not (is_blend_path(p) and p.is_file()):
        partner = p.with_name(p.name.replace("supervisions", "recordings")) if "supervisions" in p.name else p
        return [str(partner)] if partner != p and partner.is_file() else []  # a Lhotse recipe's pair
    try:
        blend = read_blend(p)
        files: list[str] = []
        for leaf in blend.leaves:
            for f in expand_paths([*leaf.paths, *leaf.tars]):
                files.extend(_folder_files(Path(f)) if Path(f).is_dir() else [f])
    except (DataprepError, OSError):
        return []  # a blend that cannot be read: its reader says why
    return files


def _key(p: str) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def refuse_same_paths(inputs: Mapping[str, PathLike | None], outputs: Mapping[str, PathLike | None], *,
                      folders: Iterable[str] = ()) -> None:
    """Raise unless every output differs from every input, from every file an input expands
    to (:func:`input_files`) and from every other output; refuse an output that is a block
    device or a socket. ``folders``: the keys of outputs that are folders replaced whole (an
    export): none may hold an input (:func:`refuse_folder_over_inputs`). Keys name the option
    (``"-o"``, ``"--rejects"``, ``"MANIFEST"``) in the one-line error."""
    outs = [(name, Path(p)) for name, p in outputs.items() if p is not None]
    ins = [(name, Path(p)) for name, p in inputs.items() if p is not None]
    for oname, o in outs:
        with contextlib.suppress(OSError):
            mode = os.stat(o).st_mode
            if stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
                raise ManifestError(f"{o}: {oname}: is a {'block device' if stat.S_ISBLK(mode) else 'socket'}, "
                                    "not a regular file; refusing to write to it (give a file path)")
        for iname, i in ins:
            if _same(o, i):
                raise ManifestError(f"{o}: {oname}: is also the input {iname}; refusing to overwrite an input")
    by_path: dict[str, tuple[str, str]] = {}
    by_inode: dict[tuple[int, int], tuple[str, str]] = {}
    for iname, i in ins:
        for f in input_files(i):
            by_path.setdefault(os.path.realpath(f), (iname, f))
            if (key := _key(f)) is not None:
                by_inode.setdefault(key, (iname, f))
    for oname, o in outs:
        hit = by_path.get(os.path.realpath(o)) or (by_inode.get(k) if (k := _key(str(o))) else None)
        if hit is not None:
            raise ManifestError(f"{o}: {oname}: is also an input: {hit[1]}, read through {hit[0]}; "
                                "refusing to overwrite an input")
    for oname in folders:
        if outputs.get(oname) is not None:
            refuse_folder_over_inputs(outputs[oname], oname, [*(str(i) for _, i in ins),  # type: ignore[arg-type]
                                                              *(f for _, f in by_path.values())])
    for k, (aname, a) in enumerate(outs):
        for bname, b in outs[k + 1:]:
            if _same(a, b):
                raise ManifestError(f"{a}: {aname} and {bname} name the same file; give them different paths")


def refuse_folder_over_inputs(folder: PathLike, option: str, inputs: Iterable[PathLike]) -> None:
    """Raise when the output ``folder`` (``option`` names it) is an input's folder or holds an
    input at any depth: ``inputs`` are files the command reads (audio, containers, manifests),
    each compared by its real path (links followed) and by its link's own folder. One line
    naming the first input found; the inputs are untouched."""
    out = os.path.realpath(folder)
    prefix = out.rstrip(os.sep) + os.sep
    for p in inputs:
        for where in {os.path.realpath(p), os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(p)) or "."),
                                                        os.path.basename(p))}:
            if where == out or where.startswith(prefix):
                raise ManifestError(f"{folder}: {option}: holds {p}, which this command reads; "
                                    "refusing to write where the inputs live (choose a new folder)")


def refuse_directory_outputs(outputs: Mapping[str, PathLike | None]) -> None:
    """Refuse, before any work, a file output (``-o model.spm``, ``-o kept.parquet``) that is an
    existing directory: one line naming the option, never a traceback at the final rename."""
    for name, p in outputs.items():
        if p is not None and Path(p).is_dir():
            raise ManifestError(f"{p}: {name}: is an existing directory; give a file path")


def require_replaceable_plan_dir(path: PathLike) -> None:
    """Refuse to write a plan over ``path`` unless it is missing, an empty directory, or a
    directory holding only a previous plan's files (``plan.json`` and ``rank-NNNNN.parquet``)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return
    if not p.is_dir() or p.is_symlink():
        raise ManifestError(f"{p}: -o: exists and is not a plan directory; refusing to replace it")
    names = sorted(x.name for x in p.iterdir())
    foreign = [n for n in names if not _PLAN_FILE.match(n)]
    if foreign:
        raise ManifestError(f"{p}: -o: not a plan directory (holds {', '.join(foreign[:3])}"
                            f"{', ...' if len(foreign) > 3 else ''}); refusing to delete what this tool did not write")
    if names and "plan.json" not in names:
        raise ManifestError(f"{p}: -o: not a plan directory (rank files but no plan.json); refusing to delete them")


def require_free_checkpoint_dir(path: PathLike, resume: bool, overwrite: bool) -> None:
    """Refuse a checkpoint directory that holds a run (``last.pt``, ``log.jsonl``, ...) unless
    ``resume`` (continue it) or ``overwrite`` (replace it) is given; with ``overwrite`` the old
    run's files are removed first, so nothing of it is mixed with the new one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ManifestError(f"{p}: --checkpoint-dir: exists and is not a directory")
    if resume and overwrite:
        raise ManifestError(f"{p}: --resume and --overwrite exclude each other")
    if resume or not p.is_dir():
        return
    run = sorted(x.name for x in p.iterdir() if RUN_FILES.match(x.name))
    if not run:
        return
    if not overwrite:
        raise ManifestError(f"{p}: --checkpoint-dir: holds a training run ({', '.join(run[:3])}); "
                            f"pass --resume to continue it or --overwrite to replace it")
    for name in run:
        (p / name).unlink()


def require_replaceable_parquet(path: PathLike) -> None:
    """Refuse to replace ``path`` when it is a regular file that is not a Parquet file (an
    audio file, a source, a config given as ``-o`` by mistake): only a manifest or rejects file,
    what this tool writes there, is replaced. A device or our stdout is written through."""
    p = Path(path)
    if output_kind(p) != "file" or not p.is_file():
        return
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError:
        return  # unreadable: the write itself gives the one-line error
    if magic not in (b"", b"PAR1"):  # an empty file holds nothing to lose
        raise OutputError(f"{p}: exists and is not a Parquet file (a manifest or rejects file this tool wrote); "
                          "refusing to replace it: remove it or give another path")


@contextlib.contextmanager
def publish_together(first: PathLike, *rest: PathLike) -> Iterator[tuple[Path, ...]]:
    """Temporary paths for Parquet outputs that belong together (a manifest and its rejects: an
    existing target must be Parquet, :func:`require_replaceable_parquet`); on success they are renamed into
    place so that ``first`` (the file consumers open, e.g. the manifest) never pairs with stale
    companions: the old ``first`` is removed, the companions renamed, ``first`` renamed last.
    A kill at any point leaves the old pair, or no ``first``, or the new pair. On an exception
    nothing is changed."""
    targets = [Path(first), *map(Path, rest)]
    for t in targets:
        require_replaceable_parquet(t)
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_path(t)) for t in targets]  # renamed in reverse order on exit
        yield tuple(tmps)
        if output_kind(targets[0]) == "file" and targets[0].exists():  # a device or stdout is written through
            targets[0].unlink()


@contextlib.contextmanager
def staged(outputs: Mapping[str, PathLike | None]) -> Iterator[dict[str, PathLike | None]]:
    """Local stand-ins for outputs that are store URLs (``s3://...``): each written into a local
    staging folder, then uploaded whole (:func:`manifests.storage.upload`) in the order given,
    so the last (the file consumers open: a manifest after its rejects) appears last; on an
    exception nothing is uploaded. Local outputs and ``None`` pass through unchanged."""
    from manifests import storage

    remote = {k: os.fspath(v) for k, v in outputs.items() if v is not None and storage.is_url(os.fspath(v))}
    if not remote:
        yield dict(outputs)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dataprep-staged.") as tmp:
        local = {k: (os.path.join(tmp, f"{i}-{storage.name(remote[k])}") if k in remote else v)
                 for i, (k, v) in enumerate(outputs.items())}
        yield local
        for k, url in remote.items():
            if os.path.exists(str(local[k])):
                storage.upload(str(local[k]), url)