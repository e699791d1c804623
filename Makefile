# python-compiled-autograd: a patch set for torch 2.13.0, shipped as a patched wheel.
# See docs/build.md. Every target is incremental: running it twice does the work once.

PYTHON ?= python3
SHARED ?= ../shared
VENV ?= .venv
# Extra options for build_scripts/build_wheel.py (see its --help), e.g.
#   make build BUILD_ARGS="--patches-dir /tmp/p --overlay-dir /tmp/o"
BUILD_ARGS ?=
# pytest processes for `make test` and `make test-upstream[-full]` (pytest-xdist; 0 runs
# the tests in one process).
TEST_WORKERS ?= 2

VENV_PYTHON := $(VENV)/bin/python
TEST_ENV := PCA_SHARED=$(abspath $(SHARED))

.PHONY: all build verify install run test test-upstream test-upstream-full fuzz bench bench-quick bench-dist bench-requirements check-build-scripts clean distclean

all: build

build:
	$(PYTHON) build_scripts/build_wheel.py $(BUILD_ARGS)

# Full RECORD/hash/version check of dist/*.whl (~5 s); the build does not need it.
verify: build
	$(PYTHON) build_scripts/verify_wheel.py dist

install: build
	$(PYTHON) build_scripts/install_venv.py --venv $(VENV) --python $(PYTHON) \
		--dist-dir dist --requirements requirements-test.txt

run: install
	@test -f bench/demo.py || { echo "make run: bench/demo.py does not exist yet (it is written with the benchmarks in bench/)" >&2; exit 1; }
	$(TEST_ENV) $(VENV_PYTHON) bench/demo.py

# The property tests (random autograd graphs, Inductor's index simplification) with
# 2,000 examples each (make test runs 200); those that compile every example through
# Dynamo (aot_eager, Inductor) run 100 (make test: 10).
fuzz: install
	PCA_HYPOTHESIS_PROFILE=fuzz $(TEST_ENV) $(VENV_PYTHON) -m pytest test/test_random_graphs.py test/test_index_simplification.py -q

# Benchmarks (bench/bench.py; method in docs/performance.md). `make bench` takes 30-60 min
# on 2 cores and writes bench/results.{md,json}; `make bench-quick` a few minutes, writing
# bench/results-quick.{md,json}. Extra options: make bench BENCH_ARGS="--backend eager".
BENCH_ARGS ?=
BENCH_ENV := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
BENCH_STAMP := $(VENV)/.bench-requirements.stamp

bench: install bench-requirements
	$(BENCH_ENV) $(VENV_PYTHON) bench/bench.py $(BENCH_ARGS)

bench-quick: install bench-requirements
	$(BENCH_ENV) $(VENV_PYTHON) bench/bench.py --quick $(BENCH_ARGS)

# Distributed benchmark (bench/bench_dist.py; docs/distributed.md): two processes on gloo
# (CPU) train an MLP and a small GPT-2 under DDP with its C++ reducer and with
# optimize_ddp="python_reducer", each with eager autograd, the legacy engine and the python
# engine; writes bench/results-dist.{md,json}. About 20-25 min on 2 cores, most of it the
# legacy engine's first compile of the GPT-2. Extra options:
# make bench-dist BENCH_DIST_ARGS="--models mlp --backend aot_eager".
BENCH_DIST_ARGS ?=

bench-dist: install
	$(VENV_PYTHON) bench/bench_dist.py $(BENCH_DIST_ARGS)

bench-requirements: $(BENCH_STAMP)

# Installed once per venv and again when bench/requirements.txt changes; the import check
# makes sure transformers works with the patched torch (its torch models need torch itself).
$(BENCH_STAMP): bench/requirements.txt
	$(VENV_PYTHON) -m pip install -q --progress-bar off -r bench/requirements.txt
	$(BENCH_ENV) $(VENV_PYTHON) -c "import torch, transformers; from transformers import GPT2LMHeadModel, BertForMaskedLM; print('[bench] transformers', transformers.__version__, 'with torch', torch.__version__)"
	touch $@

# pytest exits 5 when it collects no test: that fails here on purpose, so CI never
# passes without running tests. A test running longer than TEST_TIMEOUT seconds fails
# (pytest-timeout), and every thread's stack is printed (faulthandler's watchdog thread,
# which needs no GIL: a deadlock that holds the GIL still shows where it is).
TEST_TIMEOUT ?= 900
test: install
	$(TEST_ENV) $(VENV_PYTHON) -m pytest test -q -n $(TEST_WORKERS) \
		--timeout=$(TEST_TIMEOUT) -o faulthandler_timeout=$(TEST_TIMEOUT)

# PyTorch's own test/inductor/test_compiled_autograd.py against the installed wheel
# (test/upstream/run_upstream.py; it copies the file into build/upstream-tests, never edits
# it; docs/testing-upstream.md). ENGINE=python (default) or legacy. Fails when a test off
# the engine's list of expected differences (test/upstream/expected_differences.txt; for
# legacy expected_failures_legacy.txt) fails, or a listed test passes.
# test-upstream runs the CI subset (test/upstream/ci_subset.txt, a few minutes),
# test-upstream-full the whole file (15-25 min on 2 cores). Results:
# build/upstream/results-$(ENGINE)-ci_subset.json and results-$(ENGINE).json.
# UPSTREAM_ARGS are passed on, e.g. UPSTREAM_ARGS="-- -k hooks".
ENGINE ?= python
PYTORCH_TESTS ?= $(SHARED)/pytorch-tests
UPSTREAM_ARGS ?=
UPSTREAM_RUN = $(TEST_ENV) $(VENV_PYTHON) test/upstream/run_upstream.py --engine $(ENGINE) \
	--pytorch-tests $(PYTORCH_TESTS) --workers $(TEST_WORKERS)

test-upstream: install
	$(UPSTREAM_RUN) --subset test/upstream/ci_subset.txt $(UPSTREAM_ARGS)

test-upstream-full: install
	$(UPSTREAM_RUN) --full $(UPSTREAM_ARGS)

# Unit tests of the build scripts themselves (standard library only, ~1 s).
check-build-scripts:
	$(PYTHON) -m unittest discover -s build_scripts/tests -t build_scripts -b

clean:
	rm -rf build dist

distclean: clean
	rm -rf $(VENV)
