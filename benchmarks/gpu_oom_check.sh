#!/usr/bin/env bash
# Measured (CUDA) vs estimated batch sizes and peak memory for canary-1b-flash on a subset of
# 30x2 LibriSpeech buckets. Under 8 minutes on one GPU. Usage:
#   benchmarks/gpu_oom_check.sh [--buckets buckets.json] [--subset 4] [--model canary-1b-flash]
#   benchmarks/gpu_oom_check.sh --dry-run      # CPU, tiny model: exercises the same code path
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
