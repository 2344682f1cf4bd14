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
	$(PIP) install -q -e '.[dev,torch,plots,ray]'

demo: install
	$(PYTHON) -m dataprep.demo $(DEMO_DIR)

# the whole suite, NeMo, Lightning and Ray tests included (what CI runs), on two workers, the longest
# groups first (tests/conftest.py LONGEST_FIRST; --no-loadscope-reorder keeps that order) (a file's
# tests stay on one, so its fixtures are built once, but for the docs pages, each its own group,
# their shared demo built in the background from the start: tests/conftest.py): in a NeMo venv (about
# 2 GB) that sees the dev install, so torch, numpy and lhotse stay as pinned; made once per
# NeMo requirement, Python and torch under the cache (.ci/nemo-venv), then reused; Azurite (from
# npm, .ci/azurite) for the az:// tests. With
# SPEECH_DATAPREP_FULL_SUITE=1 a test skipped for a missing module fails instead. Bytecode is
# written (PYTHONDONTWRITEBYTECODE emptied): the suite's hundreds of interpreters then compile
# each module of the checkout once, not each time, and pytest keeps its rewritten test modules.
test: install-dev
	venv="$$(PYTHON=$(PYTHON) bash .ci/nemo-venv)" && azurite="$$(bash .ci/azurite)" && \
	PYTHONDONTWRITEBYTECODE= AZURITE_BLOB="$$azurite" SPEECH_DATAPREP_FULL_SUITE=1 "$$venv/bin/python" -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -rs --durations=30

# only the NeMo-marked tests, in the same venv
test-nemo: install-dev
	venv="$$(PYTHON=$(PYTHON) bash .ci/nemo-venv)" && \
	SPEECH_DATAPREP_FULL_SUITE=1 "$$venv/bin/python" -m pytest -rs -m nemo

bench: install-dev
	for b in benchmarks/bench_*.py; do $(PYTHON) $$b || exit 1; done

# every benchmark at a toy size (the quick ones also run in `make test`)
bench-smoke: install-dev
	$(PYTHON) -m pytest -m "slow or not slow" tests/test_benchmarks.py
