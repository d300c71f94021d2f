# The README's two commands: `make demo` and `make test`. Each sets up .venv itself, once, with what it needs:
# the demo takes feedline and a CPU torch (about 1.2 GB); the tests take every extra they exercise (about 2.7 GB).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.feedline-demo-installed
TEST_STAMP := $(VENV)/.feedline-test-installed
BENCH_STAMP := $(VENV)/.feedline-bench-installed
TORCH := torch==2.13.0
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check
# Tests run on one pytest-xdist worker more than there are cores: the suite waits on sockets and timeouts part of
# the time, and the extra worker fills it (2 cores: 3 workers 6:20, 2 workers 7:19, 4 workers 7:03).
# `make test JOBS=0` runs them in one process.
JOBS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1)" 2>/dev/null || echo auto)
# Bytecode is written for the test run even where the environment says not to (PYTHONDONTWRITEBYTECODE): without
# it every pytest process rewrites every test module's asserts again, and every worker and CLI process compiles
# feedline from source (import feedline: 0.59 CPU s, 0.39 with its bytecode).
TEST_ENV := PYTHONDONTWRITEBYTECODE=

.PHONY: demo test test-fast lint bench clean

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip >/dev/null

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing feedline and a CPU torch into $(VENV) for the demo (first run only: ~1.2 GB, 1-3 min)..."
	@$(PIP) "$(TORCH)" -e .
	@touch $(DEMO_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing feedline and its test dependencies into $(VENV) (first run only: ~2.7 GB, 2-4 min)..."
	@$(PIP) "$(TORCH)" -e ".[hf,text,dev,ray,jax,fast,s3]"
	@touch $(TEST_STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	@$(BIN)/feedline demo $(ARGS)

test: $(TEST_STAMP)
	@$(TEST_ENV) $(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup $(ARGS)

# The inner loop: everything but the tests marked slow (real clusters, long streams, full trainers).
test-fast: $(TEST_STAMP)
	@$(TEST_ENV) $(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup -m "not slow" $(ARGS)

lint: $(TEST_STAMP)
	@$(BIN)/ruff check src tests bench
	@$(BIN)/mypy

$(BENCH_STAMP): $(TEST_STAMP)
	@$(PIP) -e ".[bench]"
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	@$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
