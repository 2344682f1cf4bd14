"""Tensor batches: one plan batch (one step of one rank) -> a padded :class:`Batch`.

Audio segments are read (:mod:`dataprep.training.audio`), turned into log-mel frames
(:mod:`dataprep.training.features`, 10 ms hop) and padded; texts are tokenized with
sentencepiece as ``[bos] + pieces + [eos]`` and padded with 0. Manifest fields come from the
memory-mapped column cache (:mod:`manifests.column_cache`).
Dynamic resolution: for a plan whose batches carry ``target_frames``, a builder given the
plan's :class:`~bucketing.dynres.DynResConfig` featurizes each utterance at the rate that
brings it to the target (:func:`~dataprep.training.dynres.collate_dynamic_resolution`);
``Batch.rates`` holds the rates (Hz). ``evaluation=True`` builders pad at 10 ms.

Bad audio raises :class:`AudioError` naming the utterance and file; with ``skip_bad_audio``
the utterance is dropped from its batch and listed in ``Batch.skipped``. A row of duration 0
(text-only, in a blend) reads no audio and has 0 frames.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from bucketing.dynres import DynResConfig
from dataprep.tokenize import Tokenizers
from dataprep.training.audio import RESAMPLERS, AudioError, AudioReader, load_audio
from manifests.column_cache import ColumnCache, RowsMeta
from dataprep.training.dynres import collate_dynamic_resolution
from dataprep.training.features import FeatureConfig, LogMel
from manifests.errors import DataprepError
from manifests.options import check_choice
from manifests.plan_files import PlanBatch


@dataclass
class Batch:
    """One step's batch for one rank. Tensors are padded with 0; lengths count frames / tokens.

    ``features`` (B, T, n_mels) float32 log-mel at 100 frames/s; ``feature_lens`` (B,) int64;
    ``tokens`` (B, U) int64 ``[bos] + pieces + [eos]``; ``token_lens`` (B,) int64.
    With dynamic resolution ``features`` are at ``rates`` (B,) float64 Hz per utterance
    (None otherwise: 100 Hz).
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
    rates: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.ids)

    def padding_counts(self) -> tuple[int, int, int, int]:
        """(real frames, padded frames, real tokens, padded tokens) of this batch."""
        b = self.size
        return (int(self.feature_lens.sum()), b * int(self.features.shape[1]),
                int(self.token_lens.sum()), b * int(self.tokens.shape[1]))


def tokenize(tokenizers: Tokenizers, texts: Sequence[str], langs: Sequence[str | None],
             ids: Sequence[str]) -> list[list[int]]:
    """``[bos] + pieces + [eos]`` per text, with the model of its language."""
    out: list[list[int]] = [[] for _ in texts]
    by_lang: dict[str | None, list[int]] = {}
    for i, lang in enumerate(langs):
        by_lang.setdefault(lang, []).append(i)
    for lang, idx in by_lang.items():
        model = tokenizers.model_for(lang)
        if model is None:
            raise DataprepError(f"utterance {ids[idx[0]]!r}: no tokenizer for language {lang!r}")
        bos, eos = max(model.bos_id(), 0), max(model.eos_id(), 0)
        for i, pieces in zip(idx, model.encode([texts[i] for i in idx], out_type=int)):
            out[i] = [bos, *pieces, eos]
    return out


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
    paths and options, heavy objects are opened on first use in whichever process runs it.

    ``dynamic_resolution``: the plan's rates (``plan.json``'s ``dynamic_resolution.config``);
    used for batches that carry ``target_frames`` unless ``evaluation`` (eval loaders keep the
    fixed 10 ms hop). ``features``: the log-mel front end (default :meth:`FeatureConfig.ours`,
    80 mels). ``resampler``: how audio reaches 16 kHz (:func:`~dataprep.training.audio.load_audio`)."""

    def __init__(self, manifest: str | os.PathLike[str], tokenizer: Sequence[str], *,
                 features: FeatureConfig | None = None,
                 skip_bad_audio: bool = False, cache_dir: str | os.PathLike[str] | None = None,
                 io_threads: int = 4, dynamic_resolution: DynResConfig | None = None,
                 evaluation: bool = False, resampler: str = "soxr") -> None:
        check_choice("resampler", resampler, RESAMPLERS)
        self.resampler = resampler
        self.manifest = str(manifest)
        self.tokenizer = list(tokenizer)
        self.features = features or FeatureConfig.ours()
        self.skip_bad_audio = skip_bad_audio
        self.cache_dir = cache_dir
        self.io_threads = io_threads
        self.dynamic_resolution = dynamic_resolution
        self.evaluation = evaluation
        self._cols: ColumnCache | None = None
        self._toks: Tokenizers | None = None
        self._mel: LogMel | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0  # a pool copied into a forked worker has no threads: make a new one
        self._containers: AudioReader | None = None
        self._containers_pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cols": None, "_toks": None, "_mel": None, "_pool": None, "_containers": None}

    @property
    def containers(self) -> AudioReader:
        """This process's reader of audio inside containers (descriptors are not shared across forks)."""
        if self._containers is None or self._containers_pid != os.getpid():
            self._containers = AudioReader()
            self._containers_pid = os.getpid()
        return self._containers

    @property
    def columns(self) -> ColumnCache:
        if self._cols is None:
            self._cols = ColumnCache.open(self.manifest, self.cache_dir)
        return self._cols

    @property
    def tokenizers(self) -> Tokenizers:
        if self._toks is None:
            self._toks = Tokenizers.from_specs(self.tokenizer)
        return self._toks

    def tokenize(self, texts: Sequence[str], langs: Sequence[str | None], ids: Sequence[str]) -> list[list[int]]:
        """``[bos] + pieces + [eos]`` per text, with the model of its language."""
        return tokenize(self.tokenizers, texts, langs, ids)

    def _load(self, args: tuple[str, str, float, float, str | None, int, int, int, int, bytes | None]
              ) -> npt.NDArray[np.float32] | AudioError:
        utt, path, offset, duration, container, m_offset, m_size, group, row, held = args
        if duration == 0:  # a text-only row of a blend: no audio to read
            return np.zeros(0, dtype=np.float32)
        try:
            data = held if held is not None else self.containers.held(utt, container, m_offset, m_size, group, row)
            return load_audio(utt, path, offset, duration, data=data, resampler=self.resampler)  # type: ignore[arg-type]
        except AudioError as exc:
            if self.skip_bad_audio:
                return exc
            raise

    def read_audio(self, meta: RowsMeta, held: Sequence[bytes | None] | None = None
                   ) -> list[npt.NDArray[np.float32] | AudioError]:
        """Mono 16 kHz samples of each row of ``meta`` (loose files or ranged reads of containers,
        or ``held``: each row's audio bytes already fetched, ``None`` where not), in order; an
        :class:`AudioError` in place of a row that failed when ``skip_bad_audio``."""
        data = [None] * len(meta) if held is None else held
        jobs = [(u, p, float(o), float(d), c, int(mo), int(ms), int(g), int(r), h) for u, p, o, d, c, mo, ms, g, r, h in
                zip(meta.ids, meta.audio_paths, meta.offsets, meta.durations, meta.container_paths,
                    meta.member_offsets, meta.member_sizes, meta.row_groups, meta.group_rows, data)]
        if self._pool is not None and self._pool_pid == os.getpid():
            return list(self._pool.map(self._load, jobs))
        return list(map(self._load, jobs))

    def build(self, pb: PlanBatch, held: Sequence[bytes | None] | None = None) -> Batch:
        """The tensor batch of one plan batch (``held``: its rows' audio bytes, already fetched)."""
        meta = self.columns.gather(pb.rows, pb.ids)
        if self._mel is None:
            self._mel = LogMel(self.features)
        if self.io_threads > 1 and (self._pool is None or self._pool_pid != os.getpid()):
            self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="dataprep-audio")
            self._pool_pid = os.getpid()
        waves = self.read_audio(meta, held)
        keep = [i for i, w in enumerate(waves) if not isinstance(w, AudioError)]
        skipped = [{"id": meta.ids[i], "audio_path": meta.audio_paths[i], "error": str(w),
                    "step": str(pb.step)} for i, w in enumerate(waves) if isinstance(w, AudioError)]
        rates = None
        if self.dynamic_resolution is not None and not self.evaluation and pb.target_frames is not None and keep:
            dyn = collate_dynamic_resolution([waves[i] for i in keep], pb.target_frames,  # type: ignore[misc]
                                             config=self.dynamic_resolution, features=self._mel)
            features, feature_lens, rates = dyn.features, dyn.feature_lens, dyn.rates
        else:
            feats = [self._mel(torch.from_numpy(waves[i])) if len(waves[i])  # type: ignore[arg-type]
                     else torch.zeros(0, self.features.features) for i in keep]
            features, feature_lens = pad_stack(feats, torch.float32)
        toks = self.tokenize([meta.texts[i] for i in keep], [meta.langs[i] for i in keep],
                             [meta.ids[i] for i in keep])
        if not keep:
            features = torch.zeros(0, 0, self.features.features)
        tokens, token_lens = pad_stack([torch.tensor(t, dtype=torch.int64) for t in toks], torch.int64)
        return Batch(pb.epoch, pb.step, pb.bucket, [meta.ids[i] for i in keep], features, feature_lens,
                     tokens, token_lens, skipped, rates)
