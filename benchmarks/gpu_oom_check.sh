#!/usr/bin/env bash
# Measured (CUDA) vs estimated (fitted) batch sizes and peak memory on a subset of 30x2
# LibriSpeech buckets: canary-1b-flash, then the parakeet-tdt-0.6b transducer with the batched
# and the sample-wise loss. Under 8 minutes on one GPU. Usage:
#   benchmarks/gpu_oom_check.sh [--buckets buckets.json] [--subset 3] [--models canary-1b-flash,parakeet-tdt-0.6b:sample-wise]
#   benchmarks/gpu_oom_check.sh --dry-run      # CPU, tiny + tiny-rnnt (both modes): the same code path
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ " $* " != *" --dry-run "* ]]; then
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device visible to torch; run with --dry-run for the CPU path" >&2
    exit 2
  fi
fi
exec timeout 470 "$PY" benchmarks/gpu_oom_check.py "$@"
