# The README's commands. `make serve` sets up and runs; `make test` runs the suite (what .ci/run calls).
PROFILE ?= default
MODELS ?= models
PY := .venv/bin/python
export ORT_DISABLE_TELEMETRY := 1

.PHONY: setup models serve test lint format eval clean-models

setup:
	./scripts/setup.sh

# Build the model repository only when it holds no model (PROFILE=tiny builds every model in about two minutes).
models: setup
	@if ls $(MODELS)/*/manifest.json >/dev/null 2>&1; then echo "$(MODELS)/ has models: not rebuilding (make clean-models to rebuild)"; \
	else $(PY) -m model_export all --profile $(PROFILE) --out $(MODELS); fi

serve: models
	MODEL_REPOSITORY=$(MODELS) $(PY) -m service

test: setup
	$(PY) -m pytest -q

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy service

format: setup
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

eval: setup
	$(PY) -m model_export evaluate --models $(MODELS) --split validation --json $(MODELS)/evaluation.json

clean-models:
	rm -rf $(MODELS)
