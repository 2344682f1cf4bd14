"""The torch loader over a plan: rank ``r``'s shard from step ``k`` -> padded tensor batches.

One shard row (one step) becomes one :class:`Batch`: the utterances' audio segments are read
with soundfile (``offset`` + ``duration`` only, never the whole file for a segment), mixed
down to mono, resampled to 16 kHz with soxr where needed, turned into log-mel frames
(:mod:`dataprep.features`, 10 ms hop) and padded; the texts are tokenized with sentencepiece
as ``[bos] + pieces + [eos]`` and padded with 0.

Manifest metadata is not re-read per run: the columns the loader needs are converted once
into an uncompressed Arrow IPC file keyed by the manifest's content hash and memory-mapped,
so the time to the first batch does not grow with the corpus (see ``benchmarks/bench_loader.py``).
A batch's metadata (:class:`RowsMeta`) is numpy takes from that mapping; Python strings
(audio paths, texts) are made only when the batch's audio is read and its text tokenized.

Determinism: a batch depends only on (plan, step, manifest, tokenizer), never on the number
of workers; with DataLoader workers, worker ``w`` of ``n`` builds the batches whose position
``i`` (from the start step) has ``i % n == w`` and the DataLoader returns them in order.

Bad audio: by default a missing, unreadable or too-short file raises :class:`AudioError`
naming the utterance id and the file. With ``skip_bad_audio`` the utterance is dropped from
its batch and reported in ``Batch.skipped`` (the trainer writes those out).
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import soundfile
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataprep.features import SAMPLE_RATE, LogMel
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.io import manifest_hash
from manifests.arrow_views import numpy_view, single_chunk
from manifests.plan_files import PlanBatch, PlanShard

#: manifest columns the loader reads (ids come from the plan, which holds them per batch)
LOADER_COLUMNS = ("audio_path", "offset", "duration", "text", "lang", "num_tokens")
#: a decoded segment may fall short of the manifest duration by this much (s) before it is an error
#: (MP3 encoder padding: a header saying 2.380 s for 2.376 s of samples)
SHORT_READ_TOLERANCE = 0.05
#: layout version of the manifest column cache files
CACHE_VERSION = 3
#: audio file dictionaries up to this many paths are kept as Python strings per process
SMALL_DICTIONARY = 1 << 16
#: plan shard columns the loader reads

T = TypeVar("T")


class AudioError(DataprepError):
    """Audio of one utterance cannot be used at training time (message names id and file)."""


# --------------------------------------------------------------------------- manifest columns


def default_cache_dir() -> Path:
    """``$SPEECH_DATAPREP_CACHE`` or ``$XDG_CACHE_HOME/speech-dataprep`` (``~/.cache`` by default)."""
    env = os.environ.get("SPEECH_DATAPREP_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speech-dataprep"


@dataclass(frozen=True)
class RowsMeta:
    """Manifest fields of one batch's rows, in batch order: the metadata path of a batch.

    Numbers are numpy arrays (seconds for ``offsets`` / ``durations``); strings stay in the
    mapped cache until asked for: ``audio_codes`` index :attr:`ManifestColumns.audio_files`
    (many utterances share a file), and :attr:`audio_paths`, :attr:`texts`, :attr:`langs`
    build Python strings on first access (once per batch, for the audio reader and tokenizer).
    """

    ids: list[str]
    rows: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.float64]
    durations: npt.NDArray[np.float64]
    num_tokens: npt.NDArray[np.int64]
    audio_codes: npt.NDArray[np.int32]
    lang_codes: npt.NDArray[np.int32]
    columns: ManifestColumns = field(repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @cached_property
    def audio_paths(self) -> list[str]:
        """Audio file of each row."""
        return self.columns.audio_names(self.audio_codes)

    @cached_property
    def texts(self) -> list[str]:
        """Transcript of each row (a null text reads as ``""``)."""
        return self.columns.text.take(pa.array(self.rows)).to_pylist()  # type: ignore[no-any-return]

    @cached_property
    def langs(self) -> list[str | None]:
        """Language of each row, ``None`` where the manifest has none."""
        names = self.columns.langs
        return [names[i] for i in self.lang_codes.tolist()]


class ManifestColumns:
    """The loader's manifest columns, memory-mapped from an Arrow IPC cache file.

    The cache (``<cache_dir>/<content hash>.v3.arrow``) holds one record batch with no nulls:
    ``offset``, ``duration`` (float64, s), ``num_tokens`` (int32), ``text`` (large_string),
    ``audio_path`` and ``lang`` dictionary-encoded (int32 codes; ``""`` = no language). It is
    built once per manifest content (a few seconds at 10M rows: only these columns are read,
    paths straight from the Parquet dictionary pages) and shared by every rank and run; one
    process builds it under a file lock while the others wait, and the file appears atomically.
    Opening maps it (no read): constant time whatever the corpus size.
    """

    def __init__(self, table: pa.Table, source: str) -> None:
        self.source = source
        self.num_rows = table.num_rows
        cols = {name: single_chunk(table.column(name)) for name in LOADER_COLUMNS}
        self._offset = numpy_view(cols["offset"], np.float64)
        self._duration = numpy_view(cols["duration"], np.float64)
        self._num_tokens = numpy_view(cols["num_tokens"], np.int32)
        self._audio = numpy_view(cols["audio_path"].indices, np.int32)
        self._lang = numpy_view(cols["lang"].indices, np.int32)
        #: distinct audio files (mapped strings); ``RowsMeta.audio_codes`` index it
        self.audio_files: pa.Array = cols["audio_path"].dictionary
        #: transcripts (mapped strings), one per manifest row
        self.text: pa.Array = cols["text"]
        #: distinct languages (``None`` = none given); ``RowsMeta.lang_codes`` index it
        self.langs: list[str | None] = [x or None for x in cols["lang"].dictionary.to_pylist()]
        self._file_names: list[str] | None = None

    def audio_names(self, codes: npt.NDArray[np.int32]) -> list[str]:
        """Paths of ``audio_codes``. A small dictionary (many utterances per file) becomes Python
        strings once, on first use; a large one (one file per utterance) is decoded per call."""
        if len(self.audio_files) <= SMALL_DICTIONARY:
            if self._file_names is None:
                self._file_names = self.audio_files.to_pylist()
            names = self._file_names
            return [names[c] for c in codes.tolist()]
        return self.audio_files.take(pa.array(codes)).to_pylist()  # type: ignore[no-any-return]

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> ManifestColumns:
        """Open (building on first use) the memory-mapped columns of a compiled manifest."""
        digest = manifest_hash(manifest)
        if not digest:
            raise DataprepError(f"{manifest}: no content hash in its metadata (write it with `dataprep compile`)")
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = cache / f"{digest}.v{CACHE_VERSION}.arrow"
        num_rows = pq.ParquetFile(manifest).metadata.num_rows
        table = _open_cache(path, num_rows)
        if table is None:
            cache.mkdir(parents=True, exist_ok=True)
            with _file_lock(path.with_name(path.name + ".lock")):
                table = _open_cache(path, num_rows)  # another rank may have built it while we waited
                if table is None:
                    build_column_cache(manifest, path)
                    table = _open_cache(path, num_rows)
            if table is None:
                raise DataprepError(f"{path}: the loader's column cache of {manifest} cannot be read back")
        return cls(table, str(manifest))

    def gather(self, rows: npt.NDArray[np.int64], ids: Sequence[str]) -> RowsMeta:
        """Fields of manifest ``rows`` (row numbers) in the given order; ``ids`` are the plan's
        ids of those rows. Numpy takes only: no Python string is made here."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(ids) != rows.shape[0]:
            raise DataprepError(f"{self.source}: {len(ids)} ids for {rows.shape[0]} rows")
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise DataprepError(f"{self.source}: plan refers to row {int(rows.max())} but the manifest has "
                                f"{self.num_rows} rows (plan made from another manifest?)")
        return RowsMeta(
            ids=list(ids), rows=rows, offsets=self._offset[rows], durations=self._duration[rows],
            num_tokens=self._num_tokens[rows].astype(np.int64), audio_codes=self._audio[rows],
            lang_codes=self._lang[rows], columns=self,
        )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (POSIX ``flock``; no lock where there is none)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: concurrent builders still publish atomically
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _encoded(col: pa.ChunkedArray) -> pa.DictionaryArray:
    """One dictionary<int32, string> array of ``col`` with no nulls (null -> ``""``)."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = pa.chunked_array(col.chunks, col.type) if col.num_chunks else pa.chunked_array([], col.type)
    arr = pa.Table.from_arrays([col], ["c"]).unify_dictionaries().column(0).combine_chunks()
    values, codes = arr.dictionary, arr.indices.cast(pa.int32())
    if arr.null_count:  # rows without a value (no lang given): point them at ""
        empty = pc.index(values, "").as_py()
        if empty < 0:
            empty = len(values)
            values = pa.concat_arrays([values, pa.array([""], values.type)])
        codes = pc.fill_null(codes, empty)
    return pa.DictionaryArray.from_arrays(codes, values)


def build_column_cache(manifest: str | os.PathLike[str], path: Path) -> None:
    """Write the loader's column cache of ``manifest`` to ``path`` (atomically).

    Reads only :data:`LOADER_COLUMNS`; audio paths and languages come dictionary-encoded from
    the Parquet dictionary pages where the writer made them (no hashing of 10M strings).
    """
    try:
        t = pq.read_table(manifest, columns=list(LOADER_COLUMNS), read_dictionary=["audio_path", "lang"])
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise DataprepError(f"{manifest}: cannot read the loader's columns ({exc})") from None
    text = pc.fill_null(t.column("text").cast(pa.large_string()), "")
    table = pa.Table.from_arrays(
        [
            _encoded(t.column("audio_path")),
            pc.fill_null(t.column("offset"), 0.0).combine_chunks(),
            pc.fill_null(t.column("duration"), 0.0).combine_chunks(),
            text.combine_chunks(),
            _encoded(t.column("lang")),
            pc.fill_null(t.column("num_tokens").cast(pa.int32()), 0).combine_chunks(),
        ],
        names=list(LOADER_COLUMNS),
    )
    # atomic (temporary file + rename) but not fsynced, unlike ``manifests.io.atomic_path``: the
    # fsync of a 0.6 GB cache costs more than writing it, and a file a crash left unreadable is
    # found by ``_open_cache`` and rebuilt
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(1, table.num_rows))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open_cache(path: Path, num_rows: int) -> pa.Table | None:
    """The mapped cache table, or ``None`` when the file is missing or not a whole cache."""
    try:
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowInvalid):
        return None
    if table.num_rows != num_rows or table.schema.names != list(LOADER_COLUMNS):
        return None
    return table


# --------------------------------------------------------------------------- audio


def load_audio(utt_id: str, path: str, offset: float, duration: float | None,
               sample_rate: int = SAMPLE_RATE) -> npt.NDArray[np.float32]:
    """Mono float32 samples at ``sample_rate`` of ``path`` from ``offset`` s for ``duration`` s.

    Reads only the segment (seek + read), never the whole file. Raises :class:`AudioError`
    naming the utterance and file when the file is missing, undecodable or too short.
    """
    try:
        with soundfile.SoundFile(path) as f:
            sr = f.samplerate
            start = int(round(offset * sr))
            want = -1 if duration is None else int(round(duration * sr))
            if start > 0:
                if f.frames and start >= f.frames:
                    raise AudioError(f"utterance {utt_id!r}: {path}: offset {offset:.3f} s is past the end "
                                     f"({f.frames / sr:.3f} s)")
                f.seek(start)
            data = f.read(want, dtype="float32", always_2d=True)
    except AudioError:
        raise
    except FileNotFoundError:
        raise AudioError(f"utterance {utt_id!r}: {path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not Path(path).exists():
            problem = "audio file not found"
        raise AudioError(f"utterance {utt_id!r}: {path}: cannot decode audio ({problem})") from None
    got = data.shape[0]
    if want >= 0 and got < want - SHORT_READ_TOLERANCE * sr:
        raise AudioError(f"utterance {utt_id!r}: {path}: decoded {got / sr:.3f} s from offset {offset:.3f} s, "
                         f"manifest says {duration:.3f} s (truncated file?)")
    if got == 0:
        raise AudioError(f"utterance {utt_id!r}: {path}: no samples at offset {offset:.3f} s")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sr != sample_rate:
        import soxr

        mono = soxr.resample(mono, sr, sample_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(mono, dtype=np.float32)


# --------------------------------------------------------------------------- plan shards


# --------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """One step's batch for one rank. Tensors are padded with 0; lengths count frames / tokens.

    ``features`` (B, T, n_mels) float32 log-mel at 100 frames/s; ``feature_lens`` (B,) int64;
    ``tokens`` (B, U) int64 ``[bos] + pieces + [eos]``; ``token_lens`` (B,) int64.
    """

    epoch: int
    step: int
    bucket: int
    ids: list[str]
    features: torch.Tensor
    feature_lens: torch.Tensor
    tokens: torch.Tensor
    token_lens: torch.Tensor
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.ids)

    def padding_counts(self) -> tuple[int, int, int, int]:
        """(real frames, padded frames, real tokens, padded tokens) of this batch."""
        b = self.size
        return (int(self.feature_lens.sum()), b * int(self.features.shape[1]),
                int(self.token_lens.sum()), b * int(self.tokens.shape[1]))


def pad_stack(seqs: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``seqs`` (first dim = length) with zeros: (B, max_len, ...) and lengths (B,)."""
    lens = torch.tensor([s.shape[0] for s in seqs], dtype=torch.int64)
    if not seqs:
        return torch.zeros(0, 0, dtype=dtype), lens
    out = torch.zeros((len(seqs), int(lens.max()), *seqs[0].shape[1:]), dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
    return out, lens


class BatchBuilder:
    """Turns plan batches into tensor batches (audio, features, tokens). Picklable: state is
    paths and options, heavy objects are opened on first use in whichever process runs it."""

    def __init__(self, manifest: str | os.PathLike[str], tokenizer: Sequence[str], *, n_mels: int = 80,
                 skip_bad_audio: bool = False, cache_dir: str | os.PathLike[str] | None = None,
                 io_threads: int = 4) -> None:
        self.manifest = str(manifest)
        self.tokenizer = list(tokenizer)
        self.n_mels = n_mels
        self.skip_bad_audio = skip_bad_audio
        self.cache_dir = cache_dir
        self.io_threads = io_threads
        self._cols: ManifestColumns | None = None
        self._toks: Tokenizers | None = None
        self._mel: LogMel | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0  # a pool copied into a forked worker has no threads: make a new one

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cols": None, "_toks": None, "_mel": None, "_pool": None}

    @property
    def columns(self) -> ManifestColumns:
        if self._cols is None:
            self._cols = ManifestColumns.open(self.manifest, self.cache_dir)
        return self._cols

    @property
    def tokenizers(self) -> Tokenizers:
        if self._toks is None:
            self._toks = Tokenizers.from_specs(self.tokenizer)
        return self._toks

    def tokenize(self, texts: Sequence[str], langs: Sequence[str | None], ids: Sequence[str]) -> list[list[int]]:
        """``[bos] + pieces + [eos]`` per text, with the model of its language."""
        out: list[list[int]] = [[] for _ in texts]
        by_lang: dict[str | None, list[int]] = {}
        for i, lang in enumerate(langs):
            by_lang.setdefault(lang, []).append(i)
        for lang, idx in by_lang.items():
            model = self.tokenizers.model_for(lang)
            if model is None:
                raise DataprepError(f"utterance {ids[idx[0]]!r}: no tokenizer for language {lang!r}")
            bos, eos = max(model.bos_id(), 0), max(model.eos_id(), 0)
            for i, pieces in zip(idx, model.encode([texts[i] for i in idx], out_type=int)):
                out[i] = [bos, *pieces, eos]
        return out

    def _load(self, args: tuple[str, str, float, float]) -> npt.NDArray[np.float32] | AudioError:
        try:
            return load_audio(*args)
        except AudioError as exc:
            if self.skip_bad_audio:
                return exc
            raise

    def build(self, pb: PlanBatch) -> Batch:
        """The tensor batch of one plan batch."""
        meta = self.columns.gather(pb.rows, pb.ids)
        if self._mel is None:
            self._mel = LogMel(self.n_mels)
        if self.io_threads > 1 and (self._pool is None or self._pool_pid != os.getpid()):
            self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="dataprep-audio")
            self._pool_pid = os.getpid()
        jobs = [(u, p, float(o), float(d)) for u, p, o, d in
                zip(meta.ids, meta.audio_paths, meta.offsets, meta.durations)]
        waves = list(self._pool.map(self._load, jobs)) if self._pool is not None else list(map(self._load, jobs))
        keep = [i for i, w in enumerate(waves) if not isinstance(w, AudioError)]
        skipped = [{"id": meta.ids[i], "audio_path": meta.audio_paths[i], "error": str(w),
                    "step": str(pb.step)} for i, w in enumerate(waves) if isinstance(w, AudioError)]
        feats = [self._mel(torch.from_numpy(waves[i])) for i in keep]  # type: ignore[arg-type]
        toks = self.tokenize([meta.texts[i] for i in keep], [meta.langs[i] for i in keep],
                             [meta.ids[i] for i in keep])
        features, feature_lens = pad_stack(feats, torch.float32)
        if not keep:
            features = torch.zeros(0, 0, self.n_mels)
        tokens, token_lens = pad_stack([torch.tensor(t, dtype=torch.int64) for t in toks], torch.int64)
        return Batch(pb.epoch, pb.step, pb.bucket, [meta.ids[i] for i in keep], features, feature_lens,
                     tokens, token_lens, skipped)


class PlanDataset(IterableDataset[Batch]):
    """Rank ``rank``'s batches of the plan in ``plan_dir``, from global step ``start_step``
    up to (not including) ``stop_step``. Yields :class:`Batch`; use ``batch_size=None``
    with a DataLoader (see :func:`make_loader`)."""

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, builder: BatchBuilder,
                 start_step: int = 0, stop_step: int | None = None) -> None:
        super().__init__()
        self.plan_dir = str(plan_dir)
        self.rank = rank
        self.builder = builder
        self.start_step = start_step
        self.stop_step = stop_step

    def plan_batches(self) -> Iterator[PlanBatch]:
        """The shard's batches in the step range (metadata only)."""
        for pb in PlanShard(self.plan_dir, self.rank).iter_batches(self.start_step):
            if self.stop_step is not None and pb.step >= self.stop_step:
                return
            yield pb

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        for i, pb in enumerate(self.plan_batches()):
            if i % nw == wid:
                yield self.builder.build(pb)


def _identity(x: T) -> T:
    return x


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a background thread, ``depth`` items ahead; order is kept and
    an exception in the producer is raised in the consumer at the same position."""
    if depth <= 0:
        yield from items
        return
    q: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((0, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((1, None))
        except BaseException as exc:  # noqa: BLE001  (re-raised in the consumer)
            q.put((2, exc))

    thread = threading.Thread(target=produce, name="dataprep-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == 1:
                return
            if kind == 2:
                raise item
            yield item
    finally:
        stop.set()


def make_loader(dataset: PlanDataset, num_workers: int = 0, prefetch_depth: int = 2,
                timeout_s: float = 600.0) -> Iterable[Batch]:
    """Batches of ``dataset`` in step order, prepared ahead: in ``num_workers`` DataLoader
    worker processes, or (``num_workers=0``) in one background thread ``prefetch_depth`` ahead.
    A worker that delivers nothing for ``timeout_s`` seconds is an error, not a hang."""
    if num_workers > 0:
        return DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_identity,
                          prefetch_factor=max(1, prefetch_depth), timeout=timeout_s)
    return prefetch(dataset, prefetch_depth)
