# The README's two commands: `make demo` and `make test`. Each sets up .venv itself, once.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.feedline-installed
BENCH_STAMP := $(VENV)/.feedline-bench-installed
TORCH := torch==2.13.0

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip >/dev/null
	@echo "installing feedline and its test dependencies into $(VENV) (first run only)..."
	@$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH)" -e ".[hf,text,dev,ray,jax,fast,s3]"
	@touch $(STAMP)

demo: $(STAMP)
	@$(BIN)/feedline demo $(ARGS)

test: $(STAMP)
	@$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP)
	@$(BIN)/ruff check src tests bench
	@$(BIN)/mypy

$(BENCH_STAMP): $(STAMP)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[bench]"
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	@$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
