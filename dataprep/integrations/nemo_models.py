"""NeMo ASR models that train on a plan: :func:`use_plans`.

A NeMo ASR model builds its Lhotse loaders in ``_setup_dataloader_from_config``, which calls
``get_lhotse_dataloader_from_config`` as a global of the module that defines the method:
``rnnt_bpe_models`` (``EncDecRNNTBPEModel``: Parakeet RNNT and TDT), ``ctc_bpe_models``
(``EncDecCTCModelBPE``), ``hybrid_rnnt_ctc_bpe_models`` (``EncDecHybridRNNTCTCBPEModel``),
``aed_multitask_models`` (Canary) and the character-based ones. ``use_plans(*classes)`` points
that global, for each class given (subclasses included), at
:func:`dataprep.integrations.nemo.get_plan_dataloader`: a ``*_ds`` config with ``plan_dir``
(and ``use_lhotse: true``) replays the plan with the model's own dataset and tokenizer, any
other config goes to NeMo's own function. Call it before the model is built.
"""

from __future__ import annotations

import sys

from dataprep.integrations.nemo import get_plan_dataloader
from manifests.errors import DataprepError

__all__ = ["use_plans"]

#: the name NeMo's ``_setup_dataloader_from_config`` calls its Lhotse loader by
NEMO_LOADER = "get_lhotse_dataloader_from_config"


def use_plans(*models: type) -> list[str]:
    """Make each NeMo model class read plans (module docstring); returns the modules changed, in
    order. A class whose ``_setup_dataloader_from_config`` does not call NeMo's Lhotse loader is
    refused in one line, naming the method to override instead."""
    if not models:
        raise DataprepError("use_plans: name the NeMo model classes, e.g. use_plans(EncDecRNNTBPEModel)")
    changed: list[str] = []
    for cls in models:
        if not isinstance(cls, type):
            raise DataprepError(f"use_plans: {cls!r} is not a model class")
        owner = next((c for c in cls.__mro__ if "_setup_dataloader_from_config" in vars(c)), None)
        method = getattr(owner, "_setup_dataloader_from_config", None) if owner is not None else None
        code = getattr(method, "__code__", None)
        if owner is None or code is None or NEMO_LOADER not in code.co_names:
            where = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else cls.__qualname__
            raise DataprepError(f"use_plans: {cls.__qualname__}: {where}._setup_dataloader_from_config does not call "
                                f"{NEMO_LOADER}; override it to call dataprep.integrations.nemo.get_plan_dataloader")
        module = sys.modules[owner.__module__]
        setattr(module, NEMO_LOADER, get_plan_dataloader)
        if module.__name__ not in changed:
            changed.append(module.__name__)
    return changed
