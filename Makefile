# Two commands on a fresh machine: `make run` and `make test`. Each creates .venv on its own.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs: `run` needs the chat's dependencies only (the package, no extra); `test`,
# `lint` and the benchmarks need the `dev` extra (linters, type checker, test tools, browser
# driver, the integrations' libraries). A dev install also satisfies `run`.
RUN_STAMP := $(VENV)/.run-stamp
STAMP := $(VENV)/.installed-stamp

# Opt-in, not part of `make test`: a real llama.cpp server (llama-cpp-python) on a tiny random
# model. The first run compiles llama.cpp (~20+ minutes on 2 cores, niced) into a wheel cached
# under .cache/wheels; later runs install that wheel in seconds.
LLAMA_CPP_VERSION ?= 0.3.36
LLAMA_CPP := llama-cpp-python[server]==$(LLAMA_CPP_VERSION)
WHEELS := .cache/wheels
CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: run test test-slow lint bench bench-peers clean test-real-model

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/terrarium chat

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts chat.py
	$(BIN)/ruff format --check src tests benchmarks scripts chat.py
	$(BIN)/mypy

test: lint
	bash scripts/ensure_chromium.sh
	$(BIN)/pytest

# Opt-in, not part of `make test`: the long versions of the fault-injection, race and property
# runs (`-m slow` replaces addopts' `-m`); `make test` runs a bounded version of each.
test-slow: $(STAMP)
	$(BIN)/pytest -m slow

test-real-model: $(STAMP)
	mkdir -p $(WHEELS)
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
		CMAKE_BUILD_PARALLEL_LEVEL=$(CMAKE_BUILD_PARALLEL_LEVEL) nice -n 19 \
		$(BIN)/pip wheel --wheel-dir $(WHEELS) --find-links $(WHEELS) '$(LLAMA_CPP)'
	$(BIN)/pip install --quiet --find-links $(WHEELS) '$(LLAMA_CPP)'
	TERRARIUM_REQUIRE_REAL_MODEL=1 $(BIN)/pytest -p no:cacheprovider -m real_model tests/real_model

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_log.py

# Terrarium next to its peers (the `bench` extra: openai-agents, LangChain, LangGraph, llm,
# matplotlib); writes docs/benchmarks.md and its plots.
bench-peers: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
