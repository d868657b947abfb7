# The README's commands. `make serve` sets up and runs; `make test` runs the suite (what .ci/run calls).
PROFILE ?= default
MODELS ?= models
PY := .venv/bin/python
# The cache shared by clones (harness/cache.py says where, and why it is always safe to delete).
LINT_CACHE := $(or $(TSERVE_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/transformer-serving)/lint
# pytest-xdist workers for `make test`: most tests wait on sockets and start-ups, so more than the cores
# pay (docs/DEVELOPMENT.md has the measurement); tests/scheduling.py hands out modules longest first.
TEST_WORKERS ?= 4
export ORT_DISABLE_TELEMETRY := 1

.PHONY: setup test-fast test-deploy test-tools image models serve test lint format eval clean-models clean-podman clean-cache loadtest bench bench-request-path bench-peers soak lock audit

setup:
	./scripts/setup.sh

# Build the model repository only when it holds no model (PROFILE=tiny builds every model in about two minutes).
models: setup
	@if ls $(MODELS)/*/manifest.json >/dev/null 2>&1; then echo "$(MODELS)/ has models: not rebuilding (make clean-models to rebuild)"; \
	else $(PY) -m model_export all --profile $(PROFILE) --out $(MODELS); fi

serve: models
	MODEL_REPOSITORY=$(MODELS) $(PY) -m service

# The suite needs more than serving does: haproxy and the container tools (scripts/setup.sh --test-tools).
# Lint first: a style, type or layering fault fails CI as a failing test does.
test: setup test-tools lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=30 $(PYTEST_ARGS)

# The fast layer: the core, the pipelines, the doors' renderers and the project's own rules, with fakes
# or graphs made on the spot; no model build, no training, no apt (well under a minute).
test-fast: setup
	$(PY) -m pytest -q -m "not models and not slow and not checkpoint"

# The deployment itself (part of `make test` too): the image built and run, the compose file brought up whole
# in containers (replicas behind HAProxy, locust, a replica killed, `down`), replicas as processes behind
# Debian's haproxy, the autoscaler's queries in a real Prometheus (docs/DEPLOYMENT.md gives the times).
test-deploy: setup test-tools
	$(PY) -m pytest -q -m deploy

test-tools:
	./scripts/setup.sh --test-tools

# The image with podman and buildah where no image registry is reachable (docs/DEPLOYMENT.md):
# make image PROFILE=tiny
image: test-tools
	scripts/podman_build.sh runtime $(PROFILE)

# mypy's and import-linter's caches live outside the clone (harness/cache.py), so a fresh clone of a tree
# checked before pays for its changed modules only: mypy validates each cached module by its file's size,
# time and hash, and rechecks a changed one and what imports it (mypy: 136 CPU-s cold, 3 CPU-s warm,
# on a 2-core AMD EPYC with AVX2 and no AVX-512, measured while other work shared it).
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy --cache-dir "$(LINT_CACHE)/mypy" service model_export
	.venv/bin/lint-imports --cache-dir "$(LINT_CACHE)/import-linter"

format: setup
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

eval: setup
	$(PY) -m model_export evaluate --models $(MODELS) --split validation --json $(MODELS)/evaluation.json

# The private podman state the image tests and `make image` fill (~/.cache/transformer-serving/podman,
# outside the clone, several GB): containers,
# images, layers and build cache, all of it; the machine's own podman storage is not touched.
clean-podman:
	scripts/podman_build.sh prune

clean-models:
	rm -rf $(MODELS)

# The cache shared by clones (harness/cache.py): the tiny test models and the podman state. Always safe:
# the next run rebuilds what it needs.
clean-cache: clean-podman
	$(PY) -c "import shutil; from harness.cache import cache_root; shutil.rmtree(cache_root(), ignore_errors=True)"

# Load test against a private service and Redis (loadtests/README.md): make loadtest ARGS="--duration 60s --users 16"
loadtest: setup
	loadtests/run --models $(MODELS) $(ARGS)

# Every benchmark, side by side, appended to benchmarks/RESULTS.md (about 18 minutes on 2 cores).
bench: setup
	$(PY) benchmarks/run_all.py --models $(MODELS) --json benchmarks/latest.json

# The request path alone: every door on the fake engine, driven by wrk and h2load, beside the baseline commit's
# service (benchmarks/request_path.py; needs ./scripts/setup.sh --test-tools for wrk and h2load).
bench-request-path: setup test-tools
	$(PY) benchmarks/request_path.py --models $(MODELS) --profile

# The same classifier behind LitServe, Ray Serve, Triton and MLServer vs this service (benchmarks/README.md,
# "Peers"): the peers install into venvs of their own (LitServe and Ray in one), never the service's.
bench-peers: setup .venv-peers/bin/python .venv-triton/bin/python .venv-mlserver/bin/python
	$(PY) benchmarks/peers.py --models $(MODELS) --peers-python .venv-peers/bin/python \
		--triton-python .venv-triton/bin/python --mlserver-python .venv-mlserver/bin/python

.venv-peers/bin/python:
	$(PY) -m venv .venv-peers
	.venv-peers/bin/pip install -e ".[peers]"

.venv-triton/bin/python:
	$(PY) -m venv .venv-triton
	.venv-triton/bin/pip install -e ".[peers-triton]"

.venv-mlserver/bin/python:
	$(PY) -m venv .venv-mlserver
	.venv-mlserver/bin/pip install -e ".[peers-mlserver]"

# Ten times the measured capacity for five minutes: the overload contract (README, "Overload and soak").
soak: setup
	$(PY) loadtests/overload.py --models $(MODELS) --duration 300 --factor 10

# Pin the service's dependencies, and audit the pins for known vulnerabilities.
lock: setup
	.venv/bin/pip-compile --quiet --strip-extras --no-emit-index-url --no-emit-find-links --output-file requirements.lock pyproject.toml

audit: setup
	.venv/bin/pip-audit -r requirements.lock --no-deps --disable-pip --progress-spinner off
