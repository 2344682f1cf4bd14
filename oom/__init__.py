"""Per-bucket batch-size search (the OOMptimizer): real CUDA bisection, a device-free
estimate, and the reference encoder-decoder models it measures. Needs the ``torch`` extra."""
