PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
DEMO_DIR ?= demo-out

.PHONY: install install-dev demo test test-nemo bench bench-smoke

# the core plus matplotlib for the demo's plots and altair for its HTML report (no torch)
install:
	$(PIP) install -q -e '.[plots,report]'

# torch 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
install-dev:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,torch,plots]'

demo: install
	$(PYTHON) -m dataprep.demo $(DEMO_DIR)

test: install-dev
	$(PYTHON) -m pytest

# NeMo (about 2 GB) into its own venv that sees the dev install, so torch, numpy and lhotse stay as pinned
NEMO_VENV ?= .venv-nemo
test-nemo: install-dev
	$(PYTHON) -m venv --system-site-packages $(NEMO_VENV)
	$(NEMO_VENV)/bin/python -m pip install -q 'nemo-toolkit[asr]'
	$(NEMO_VENV)/bin/python -m pytest -m nemo
	$(NEMO_VENV)/bin/python -m pytest tests/test_readme_examples.py  # Lightning comes with NeMo

bench: install-dev
	for b in benchmarks/bench_*.py; do $(PYTHON) $$b || exit 1; done

# every benchmark at a toy size (the quick ones also run in `make test`)
bench-smoke: install-dev
	$(PYTHON) -m pytest -m "slow or not slow" tests/test_benchmarks.py
