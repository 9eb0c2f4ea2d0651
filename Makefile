# ckpt-rollout — every set-up step a fresh machine needs lives here or in scripts it calls.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CRD_FILE := crds/checkpointrollouts.rollout.ckpt.dev.yaml
MANIFEST_SCHEMA := operator/ckpt_api/manifest.schema.json
AGENT_SETTINGS_SCHEMA := worker_image/agent-settings.schema.json
PYPATHS := operator:worker_image:e2e

# Test tiers by cost (markers that ckpt_e2e.tiers gives each test from what it needs; any subset
# is one flag, e.g. `pytest -m 'not cluster'`):
#   make check   lint, types, layers and the quick tests: the loop after each edit (< 2 min on 2 cores)
#   make unit    every test that needs no cluster: the quick ones, mutation, benches, fuzzing
#   make test    everything (README's command, CI): set-up, lint, the image and real-node tiers
#                with the cluster-free tiers beside them (niced), then the kwok scenarios on every core
QUICK := not (cluster or images or realnode or mutation or bench or fuzz)
CLUSTER_FREE := not (cluster or images or realnode)
# The cluster tier splits in two: the kwok scenarios run on every core, each pytest-xdist worker
# with a control plane of its own (free ports, its own temp dir; a file's tests stay on one worker
# and share its fixtures); the image and real-node tests run in one process, as there is one
# kubelet and one image store.
KWOK_TIER := cluster and not (images or realnode)
NODE_TIERS := images or realnode
# pytest-xdist workers for the cluster-free tiers and the kwok scenarios (auto: one per core).
JOBS ?= auto

.PHONY: install system-deps test unit check tools lint crds verify demo clean

install: $(VENV)/.installed

# Debian packages the tests and the demo need (Mooncake's libraries, iproute2, shellcheck, podman,
# buildah, mmdebstrap, runc, and containerd, CNI plugins, iptables for the real node): installs
# only what is missing, so a set-up machine pays ~0.1 s.
system-deps:
	bash scripts/install-system-deps.sh dev

# Every pin comes from constraints.txt (make lock), as in both images. pip byte-compiles: with
# PYTHONDONTWRITEBYTECODE set (as on CI's machines) nothing else would, and every agent process would
# compile paddle anew (a cold CI ran 4.5 min longer with --no-compile). The harness and benches
# (e2e/ckpt_e2e) are not in the wheel: a .pth file puts e2e/ on the venv's path.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[operator,agent,paddle,mooncake,dev]'
	echo "$(CURDIR)/e2e" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ckpt-rollout-harness.pth"
	touch $@

# constraints.txt from pyproject's requirements (needs the resolver in the dev extra: uv).
.PHONY: lock
lock: install
	$(BIN)/python -m ckpt_e2e.lockfile

# All set-up: system packages first (buildah, podman, containerd; provision may apt-get Go), then
# the Go builds (provision: both cores for ~30 min cold) beside the venv (downloads) and the images
# (downloads and disk, after the venv whose Python builds them). A warm machine: seconds.
SETUP_JOBS := install provision images
.PHONY: setup
setup: system-deps
	$(MAKE) --no-print-directory -j3 $(SETUP_JOBS)

images: install

# README's test command: all set-up (system packages, venv, control-plane binaries, both images),
# then lint, types, layering and every test tier; nothing is skipped for a missing tool. Every
# pytest run goes on when another fails, so one run reports every failure.
# The real-node tier waits on a kubelet, containerd and pods starting and keeps the cores only
# about half busy; the cluster-free tier (the mutation run: ~10 min of both cores on a cold
# machine) is all compute and never times anything. So the cluster-free tier runs beside the node
# tier at a lower priority (nice), taking only the cycles the node tier leaves; its output is
# printed whole once it ends. The kwok scenarios keep both cores busy, so they run alone.
# Of the cluster-free tier, the mutation run (~12 min of both cores cold, seconds once cached)
# starts earlier still: as soon as the venv exists, niced, beside set-up's Go and image builds,
# which leave a core idle while they download, link and unpack (a cold set-up is ~15 min).
CLUSTER_FREE_LOG := .pytest-cluster-free.log
MUTATION_LOG := .pytest-mutation.log
test: system-deps
	$(MAKE) --no-print-directory -j4 $(SETUP_JOBS) mutation-started
	$(MAKE) --no-print-directory lint
	rc=0; \
	echo "make test: the cluster-free tier runs beside the node tier (nice 10); its output follows the node tier's"; \
	nice -n 10 $(BIN)/pytest -n $(JOBS) -p no:cacheprovider -m "$(CLUSTER_FREE) and not mutation" > $(CLUSTER_FREE_LOG) 2>&1 & free=$$!; \
	$(BIN)/pytest -m "$(NODE_TIERS)" || rc=$$?; \
	wait $$free || rc=$$?; \
	echo "make test: the cluster-free tier's output:"; cat $(CLUSTER_FREE_LOG); \
	while kill -0 "$$(cat $(MUTATION_LOG).pid)" 2>/dev/null; do sleep 2; done; \
	echo "make test: the mutation run's output:"; cat $(MUTATION_LOG); \
	[ "$$(cat $(MUTATION_LOG).rc 2>/dev/null)" = 0 ] || { echo "make test: the mutation run failed"; rc=1; }; \
	$(BIN)/pytest -n $(JOBS) --dist loadfile -m "$(KWOK_TIER)" || rc=$$?; \
	exit $$rc

# Starts test's mutation run in the background and returns (its pid, output and exit status in
# $(MUTATION_LOG)*; `make test` waits for it before the kwok tier).
.PHONY: mutation-started
mutation-started: install
	rm -f $(MUTATION_LOG).rc
	(nice -n 10 $(BIN)/pytest -p no:cacheprovider -m mutation > $(MUTATION_LOG) 2>&1; \
	 echo $$? > $(MUTATION_LOG).rc) & echo $$! > $(MUTATION_LOG).pid

# The tools the cluster-free tests run: helm (chart rendering) and promtool (alert rule tests),
# built once and cached like the control plane; shellcheck and lua come with system-deps. So a
# fresh machine's `make check` or `make unit` skips nothing either.
tools: system-deps
	python3 e2e/ckpt_e2e/provision.py helm promtool > /dev/null

unit: install tools
	$(BIN)/pytest -n $(JOBS) -m "$(CLUSTER_FREE)"

check: install tools lint
	$(BIN)/pytest -n $(JOBS) -m "$(QUICK)" tests

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=$(PYPATHS) $(BIN)/mypy
	PYTHONPATH=$(PYPATHS) $(BIN)/lint-imports

# The CRD (crds/), the chart's generated files (values.yaml, values.schema.json, the CRD
# template), the checkpoint manifest's and the agent settings' JSON schemas and docs/reference/,
# all from the models (the agent settings' first: the chart's agentSettings schema reads it).
crds: install
	$(BIN)/python -m ckpt_agent.settings > $(AGENT_SETTINGS_SCHEMA)
	$(BIN)/ckpt-rollout crd > $(CRD_FILE)
	$(BIN)/python -m ckpt_rollout.chartgen.chart_files charts/ckpt-rollout
	$(BIN)/python -m ckpt_api.manifest > $(MANIFEST_SCHEMA)
	$(BIN)/python -m ckpt_e2e.reference_docs docs/reference

# crds, plus the static manifest of the `kubectl apply` install path (needs helm: provisioned
# like the control-plane binaries).
.PHONY: generate
generate: crds
	helm=$$(python3 e2e/ckpt_e2e/provision.py helm | cut -f2) && \
	$(BIN)/python -m ckpt_rollout.chartgen.chart_files charts/ckpt-rollout \
	  --helm "$$helm" --static-manifest examples/kubectl/operator.yaml

# Regenerates every generated file and fails if the committed copies differ.
verify: generate
	git diff --exit-code -- crds/ charts/ examples/kubectl/ docs/reference/ $(MANIFEST_SCHEMA) $(AGENT_SETTINGS_SCHEMA)

# README's main job: the whole product on a local control plane, ending in `demo: OK ...`.
demo: install system-deps provision
	$(BIN)/python -m ckpt_e2e.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

-include e2e/cluster.mk
-include e2e/images.mk
