# Local control plane targets; included by the top-level Makefile.
#   make provision     build (or find cached) kube-apiserver, controller-manager, scheduler,
#                      etcd, kwok, kubectl, helm: see e2e/ckpt_e2e/provision.py
#   make cluster-up    start a local cluster, write .cluster/kubeconfig, print the export line
#   make cluster-down  stop it (no process left behind)
E2E_PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
E2E_STATE ?= .cluster

.PHONY: provision cluster-up cluster-down

provision:
	bash e2e/provision.sh

cluster-up: provision
	PYTHONPATH=e2e $(E2E_PYTHON) -m ckpt_e2e.clusterctl up --state-dir $(E2E_STATE)

cluster-down:
	PYTHONPATH=e2e $(E2E_PYTHON) -m ckpt_e2e.clusterctl down --state-dir $(E2E_STATE)
