# Local control plane targets; included by the top-level Makefile.
#   make provision     build (or find cached) kube-apiserver, controller-manager, scheduler,
#                      kubelet, kube-proxy, etcd, kwok, kubectl, helm, prometheus, promtool,
#                      lws-manager (the LeaderWorkerSet controller, for the multi-node tests):
#                      see e2e/ckpt_e2e/provision.py
#   make cluster-up    start a local cluster, write .cluster/kubeconfig, say how to use it
#   make cluster-up REAL_NODE=1   ... plus one real kubelet + containerd node beside the kwok ones
#                      (e2e/ckpt_e2e/realnode.py; needs root and `make system-deps`), with the
#                      images `make images` built imported into its containerd
#   make cluster-env   print the lines that point a shell at it: KUBECONFIG, and kubectl, helm
#                      and ckpt-rollout on PATH (`eval "$(make -s cluster-env)"`)
#   make cluster-down  stop it (no process left behind)
E2E_PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
E2E_STATE ?= .cluster
REAL_NODE ?=

.PHONY: provision cluster-up cluster-env cluster-down

provision:
	bash e2e/provision.sh

cluster-up: provision
	PYTHONPATH=e2e $(E2E_PYTHON) -m ckpt_e2e.clusterctl up --state-dir $(E2E_STATE) $(if $(REAL_NODE),--real-node)

cluster-env:
	@PYTHONPATH=e2e $(E2E_PYTHON) -m ckpt_e2e.clusterctl env --state-dir $(E2E_STATE)

cluster-down:
	PYTHONPATH=e2e $(E2E_PYTHON) -m ckpt_e2e.clusterctl down --state-dir $(E2E_STATE)
