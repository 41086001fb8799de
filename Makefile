# The two commands a newcomer needs are `make run` and `make test`; both build .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
VAR    := var

.PHONY: run test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python client/pyproject.toml sidecar/pyproject.toml
	$(BIN)/python -m pip install --quiet -e ./client -e ./sidecar
	touch $@

$(TSTAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

run: $(STAMP)
	mkdir -p $(VAR)
	$(BIN)/openwop-memory serve --socket $(VAR)/openwop-memory.sock \
	    --database sqlite:///$(VAR)/openwop-memory.db --log-format console

lint: $(TSTAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TSTAMP)
	$(BIN)/mypy

unit: $(TSTAMP)
	$(BIN)/python -m pytest

test: lint typecheck unit

# A report, not a gate: exits 0 whatever the numbers. Options: make bench BENCH_ARGS="--quick --json"
bench: $(TSTAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VAR)
