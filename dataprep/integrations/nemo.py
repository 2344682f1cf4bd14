"""NeMo: ``get_plan_dataloader``, a drop-in for NeMo's ``get_lhotse_dataloader_from_config``
that replays a plan instead of re-bucketing online.

Same signature: ``(config, global_rank, world_size, dataset, tokenizer=None)``. The config (a
dict or an OmegaConf ``train_ds``) adds ``plan_dir`` and ``manifest``; ``sample_rate``,
``channel_selector`` (a channel number, or as NeMo a cut field naming each row's channel),
``num_workers``, ``pin_memory``, ``force_iterable_dataset`` and ``seed`` are read as NeMo reads
them, ``prefetch_steps`` / ``prefetch_bytes`` as ``PlanSampler`` takes them; bucketing, batch size
and filters are the plan's; a config without ``plan_dir`` goes to NeMo's own function. The
``dataset`` gets each step's ``CutSet`` of this rank (dynamic-resolution plans add
``target_frames``). ``state_dict()`` resumes at exactly the next batch, map-style or iterable
(``len()`` is the whole pass, as Lightning counts it); after the plan's last step the run ends
cleanly (:class:`dataprep.integrations.lhotse.PlanEnded`: ``fit()`` returns, one line). Token
counts come from compile (``--prompt-format canary2``), so ``tokenizer`` is not needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from dataprep.integrations.lhotse import PlanDataLoader, PlanIterableLoader, PlanSampler
from dataprep.integrations.prefetch import DEFAULT_PREFETCH_BYTES, PrefetchOptions
from manifests.errors import DataprepError, OptionError
from manifests.options import check_bool, check_int, check_sample_rate, check_str
from manifests.plan_meta import read_plan_meta


def _resample(cuts: Any, sampling_rate: int) -> Any:
    """NeMo's per-cut safeguard resampling (a no-op for cuts already at ``sampling_rate``)."""
    return cuts.resample(sampling_rate)


def _select_channels(cuts: Any, field: str) -> Any:
    """NeMo's ``channel_selector: FIELD``: each cut keeps the channel its ``custom[FIELD]`` names
    (a mono cut stays as it is); a cut without the field, or naming a channel its audio lacks,
    is one line naming the cut."""
    from lhotse import CutSet

    def one(cut: Any) -> Any:
        custom = cut.custom or {}
        if field not in custom:
            raise DataprepError(f"config: channel_selector: cut {cut.id} has no field {field!r} naming its channel")
        idx = custom[field]
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < cut.num_channels:
            raise DataprepError(f"config: channel_selector: cut {cut.id}: {field}={idx!r} is not one of its "
                                f"{cut.num_channels} channel(s)")
        return cut if cut.num_channels == 1 else cut.with_channels(idx)

    return CutSet.from_cuts(one(c) for c in cuts)


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


#: NeMo's string seeds: they mean nothing for a fixed plan (0)
_NEMO_SEED_WORDS = ("randomized", "trng")


def _seed(config: Any) -> int:
    """NeMo's ``seed``: an int as given, "randomized" / "trng" -> 0; anything else is refused
    (a digit string is not coerced)."""
    seed = _get(config, "seed", 0)
    if seed in _NEMO_SEED_WORDS:
        return 0
    with _config_errors():
        check_int("seed", seed, ge=0, le=2**32 - 1)
    return seed  # type: ignore[no-any-return]


@contextmanager
def _config_errors() -> Iterator[None]:
    """An :class:`OptionError` of a config value as ``config: KEY: problem`` (a DataprepError)."""
    try:
        yield
    except OptionError as exc:
        raise OptionError(f"config: {exc.field}", exc.problem) from None


def get_plan_dataloader(config: Any, global_rank: int, world_size: int, dataset: torch.utils.data.Dataset,
                        tokenizer: Any = None) -> torch.utils.data.DataLoader:
    """A DataLoader that yields ``dataset[cuts]`` for each step of rank ``global_rank``'s plan shard
    (see the module docstring); NeMo's own loader for a config without ``plan_dir``."""
    if _get(config, "plan_dir") is None:
        from nemo.collections.common.data.lhotse.dataloader import (
            get_lhotse_dataloader_from_config,
        )

        return get_lhotse_dataloader_from_config(config, global_rank=global_rank, world_size=world_size,
                                                 dataset=dataset, tokenizer=tokenizer)
    manifest = _get(config, "manifest")
    if manifest is None:
        raise DataprepError("config: plan_dir is set but manifest (the compiled manifest of the plan) is not")
    channel = _get(config, "channel_selector")
    field = channel if isinstance(channel, str) else None  # NeMo's: the cut's custom field naming its channel
    with _config_errors():  # a channel number: a plan replays one channel of each row
        if field is not None:
            check_str("channel_selector", field)
            channel = None
        check_int("channel_selector", channel, ge=0, le=None, optional=True)
    sample_rate, num_workers = _get(config, "sample_rate", 16000), _get(config, "num_workers", 0)
    pin_memory, iterable = _get(config, "pin_memory", False), _get(config, "force_iterable_dataset", False)
    with _config_errors():  # checked as given: never coerced
        check_sample_rate("sample_rate", sample_rate)
        check_int("num_workers", num_workers, ge=0, le=1024)
        check_bool("pin_memory", pin_memory)
        check_bool("force_iterable_dataset", iterable)
    seed = _seed(config)
    with _config_errors():
        prefetch = PrefetchOptions(_get(config, "prefetch_steps", 0), _get(config, "prefetch_bytes", DEFAULT_PREFETCH_BYTES))
    sampler = PlanSampler(str(_get(config, "plan_dir")), str(manifest), rank=global_rank, world_size=world_size,
                          channel=channel, prefetch_steps=prefetch.prefetch_steps, prefetch_bytes=prefetch.prefetch_bytes)
    if "dynamic_resolution" in read_plan_meta(str(_get(config, "plan_dir"))).extra:
        dataset = WithTargetFrames(dataset)
    if field is not None:
        sampler.map(partial(_select_channels, field=field))
    sampler.map(partial(_resample, sampling_rate=sample_rate))
    if iterable:
        from lhotse.dataset.dataloading import make_worker_init_fn

        return PlanIterableLoader(
            dataset, sampler, num_workers=num_workers, pin_memory=pin_memory, persistent_workers=num_workers > 0,
            worker_init_fn=make_worker_init_fn(rank=global_rank, world_size=world_size, seed=seed),
        )
    return PlanDataLoader(dataset, sampler, num_workers=num_workers, pin_memory=pin_memory)


class WithTargetFrames(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``dataset[cuts]`` with the plan batch's ``target_frames`` (the cuts' ``plan_target_frames``)
    put on the batch: a key of a dict batch, an attribute of any other."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, cuts: Any) -> Any:
        batch = self.dataset[cuts]
        target = next(iter(cuts)).custom.get("plan_target_frames") if len(cuts) else None
        if target is None:
            return batch
        if isinstance(batch, dict):
            batch["target_frames"] = int(target)
            return batch
        try:
            batch.target_frames = int(target)
        except (AttributeError, TypeError):
            raise DataprepError(f"config: the dataset's batches ({type(batch).__name__}) cannot carry target_frames; "
                                "return a dict or an object with attributes") from None
        return batch
