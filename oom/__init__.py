"""Per-bucket batch-size search (the OOMptimizer): real CUDA bisection, a device-free
estimate, and the reference encoder-decoder models it measures. Needs the ``torch`` extra."""

# the public modules (imported on use, so that the torch-free oom.options loads without torch)
__all__ = [
    "cache",
    "encoder",
    "estimate",
    "fit",
    "isolate",
    "lattice",
    "models",
    "optimize",
    "options",
    "packed_estimate",
    "search",
    "speech_llm",
    "step",
    "transducer",
]
