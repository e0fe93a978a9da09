# The two commands from the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# gpustat, nvitop and nvitop-exporter for `make bench-compare`, apart from gpuconsole's venv
COMPARE_VENV ?= .venv-compare
BENCH_COMPARE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck contracts pytest bench bench-compare bench-soak test-snapshot-update snapshots-update clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gpuconsole needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(VENV)/.installed $@

## the console on a simulated cluster
demo: $(VENV)/.installed
	$(BIN)/gpuconsole demo

## ruff, the import contract, mypy on the core, then pytest
test: lint contracts typecheck pytest

lint: $(VENV)/.installed-test
	$(BIN)/ruff check gpuconsole tests benchmarks
	$(BIN)/ruff format --check gpuconsole tests benchmarks

contracts: $(VENV)/.installed-test
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

pytest: $(VENV)/.installed-test
	$(BIN)/pytest -q $(PYTEST_ARGS)

## speed and memory figures (medians), printed
bench: $(VENV)/.installed-test
	$(BIN)/python -m benchmarks

$(COMPARE_VENV)/.installed: benchmarks/compare/requirements.txt
	$(PYTHON) -m venv $(COMPARE_VENV)
	$(COMPARE_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMPARE_VENV)/bin/python -m pip install -q -r benchmarks/compare/requirements.txt
	touch $@

## beside gpustat, nvitop and nvitop-exporter on one fake NVML: prints, writes benchmarks/RESULTS.md
## (BENCH_COMPARE_ARGS="--duration 30", "--profile DIR"; see python -m benchmarks.compare -h)
bench-compare: $(VENV)/.installed $(COMPARE_VENV)/.installed
	$(BIN)/python -m benchmarks.compare --tools $(COMPARE_VENV) $(BENCH_COMPARE_ARGS)

## the soak run: demo fleet, faults, an ssh session and scrapes (MINUTES=30 by default)
bench-soak: $(VENV)/.installed-test
	$(BIN)/python -m benchmarks.soak --minutes $(or $(MINUTES),30)

## rewrite the SVG snapshots under snapshots/
test-snapshot-update snapshots-update: $(VENV)/.installed-test
	$(BIN)/pytest -q tests/test_tui_snapshots.py --snapshot-update

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
