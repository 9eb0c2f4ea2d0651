#!/usr/bin/env bash
# Provisions the local control plane (`make provision`, which README's `make test` and `make demo`
# run): makes sure a Go toolchain exists, then builds (or finds cached) the pinned kube-apiserver,
# controller-manager, scheduler, kubectl, the real node's kubelet and kube-proxy, etcd, kwok,
# helm, prometheus + promtool (monitoring tests), and e2e/kstatus (Flux's health rules, GitOps
# tests; keyed by a hash of its source) under ~/.cache/ckpt-rollout/bin/<version>/.
# A warm cache makes this take a second; a cold build takes ~20-30 min on 2 cores (prometheus
# and promtool alone ~6 min). Re-runnable;
# output of the Go build goes to ~/.cache/ckpt-rollout/build/<component>-<version>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

need_go="1.26"
go_ok() {
  command -v go >/dev/null 2>&1 || return 1
  local v
  v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$need_go" "$v" | sort -V | head -1)" = "$need_go" ]
}

if ! go_ok; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  fi
fi
if ! go_ok; then
  # Debian's Go is older than the modules need; it serves only to fetch the pinned
  # toolchain, which the go command takes from the module proxy (GOTOOLCHAIN).
  echo "provision: Go >= $need_go not found; installing golang-go to bootstrap" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq golang-go >/dev/null
  export GOTOOLCHAIN="go1.26.8"
fi

start=$(date +%s)
python3 e2e/ckpt_e2e/provision.py
echo "provision: control-plane binaries ready in $(( $(date +%s) - start ))s"
