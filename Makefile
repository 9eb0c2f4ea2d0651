# ckpt-rollout — every set-up step a fresh machine needs lives here or in scripts it calls.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CRD_FILE := crds/checkpointrollouts.rollout.ckpt.dev.yaml
PYPATHS := operator:worker_image:e2e

.PHONY: install test unit lint crds verify demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[operator,agent,dev]'
	touch $@

# README's test command: lint, types, layering, then every test tier that runs without Docker.
test: install provision lint
	$(BIN)/pytest

unit: install
	$(BIN)/pytest tests

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=$(PYPATHS) $(BIN)/mypy
	PYTHONPATH=$(PYPATHS) $(BIN)/lint-imports

# The CRD (crds/) and the chart's generated files (values.yaml, values.schema.json, the CRD
# template), all from the pydantic models.
crds: install
	$(BIN)/ckpt-rollout crd > $(CRD_FILE)
	$(BIN)/python -m ckpt_rollout.chart_values charts/ckpt-rollout

# crds, plus the static manifest of the `kubectl apply` install path (needs helm: provisioned
# like the control-plane binaries).
.PHONY: generate
generate: crds
	helm=$$(python3 e2e/ckpt_e2e/provision.py helm | cut -f2) && \
	$(BIN)/python -m ckpt_rollout.chart_values charts/ckpt-rollout \
	  --helm "$$helm" --static-manifest examples/kubectl/operator.yaml

# Regenerates every generated file and fails if the committed copies differ.
verify: generate
	git diff --exit-code -- crds/ charts/ examples/kubectl/

# README's main job: the whole product on a local control plane, ending in `demo: OK ...`.
demo: install provision
	$(BIN)/python -m ckpt_e2e.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

-include e2e/cluster.mk
