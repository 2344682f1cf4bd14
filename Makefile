PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
DEMO_DIR ?= demo-out

.PHONY: install install-dev demo test bench

# the core plus matplotlib for the demo's plots (no torch)
install:
	$(PIP) install -q -e '.[plots]'

# torch 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
install-dev:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,torch,plots]'

demo: install
	$(PYTHON) -m dataprep.demo $(DEMO_DIR)

test: install-dev
	$(PYTHON) -m pytest

bench: install-dev
	for b in benchmarks/bench_*.py; do $(PYTHON) $$b || exit 1; done
