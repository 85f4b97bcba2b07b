# Two commands on a fresh machine: `make run` and `make test`. Each creates .venv on its own.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/terrarium chat

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts chat.py
	$(BIN)/ruff format --check src tests benchmarks scripts chat.py
	$(BIN)/mypy

test: lint
	bash scripts/ensure_chromium.sh
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_log.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
