# The front door: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup lock run test test-fast lint format bench clean phoenix image-wheels

setup: $(VENV)/.installed

# Exactly the lock: every distribution, transitive ones included, pinned with its hashes
# (pip refuses anything else), then this tree, editable, built with the locked setuptools.
$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements.lock
	@# --force-reinstall and no cache: pip may reuse an editable wheel built from another
	@# checkout; rebuilt here, `import piserini_ray` always means this tree.
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --no-cache-dir --force-reinstall -e .
	@# The searchers' JVM class archive (piserini_ray/retrieval/class_archive.py): their JVMs
	@# boot in half the CPU. Only an optimization: setup goes on without it.
	-$(BIN)/python -m piserini_ray.retrieval._archive_main
	touch $@

# Refresh requirements.lock from pyproject.toml: pins kept where pyproject still allows them
# (UPGRADE=1: everything to its newest allowed release). Then `make setup` installs it.
lock: setup
	$(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --extra dev \
		--no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade) \
		--output-file requirements.lock pyproject.toml

# Phoenix, the trace backend the traces test sends a run's spans to (tests/monitor/test_traces.py):
# in an environment of its own (its dependencies are not the product's), pinned.
PHOENIX_VERSION := 20.26.1
phoenix: .venv-phoenix/.installed
.venv-phoenix/.installed:
	$(PYTHON) -m venv .venv-phoenix
	.venv-phoenix/bin/pip install --quiet arize-phoenix==$(PHOENIX_VERSION)
	touch $@

# The wheels the KubeRay image installs beside the package index (jobs/k8s/wheels/README.md):
# torch's CPU build, which PyPI does not serve, checked against the lock's hash.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
image-wheels: setup
	mkdir -p build && grep -A1 '^torch==' requirements.lock | sed 's/ \\$$//' | tr '\n' ' ' > build/torch.txt
	$(BIN)/pip download --quiet --no-deps --require-hashes --dest jobs/k8s/wheels \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r build/torch.txt

run: setup
	$(BIN)/piserini-ray run

test: setup
	$(BIN)/python -m pytest

# The fast tier: the tests that start neither Ray, a JVM nor a cluster (marked in conftest).
test-fast: setup
	$(BIN)/python -m pytest -m "not heavy"

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
	rm -rf $(VENV) .venv-phoenix .pytest_cache .ruff_cache
