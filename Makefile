# The front door: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup run test lint format bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@# pip may reuse a cached editable wheel built from another checkout; rebuild it here so
	@# that `import piserini_ray` always means this tree.
	$(BIN)/pip install --quiet --no-deps --no-cache-dir --force-reinstall -e .
	touch $@

run: setup
	$(BIN)/piserini-ray run

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python bench/search_latency.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
