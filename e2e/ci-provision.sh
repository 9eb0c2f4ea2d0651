#!/usr/bin/env bash
# Provisions the local control plane for CI: makes sure a Go toolchain exists, then builds (or
# finds cached) the pinned kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok and
# helm under ~/.cache/ckpt-rollout/bin/<version>/. A warm cache makes this take a second; a
# cold build takes ~15-25 min on 2 cores. Re-runnable; output of the Go build goes to
# ~/.cache/ckpt-rollout/build/<component>-<version>.log.
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
  echo "ci-provision: Go >= $need_go not found; installing golang-go to bootstrap" >&2
  apt-get update -qq && apt-get install -y -qq golang-go >/dev/null
  export GOTOOLCHAIN="go1.26.8"
fi

# --- shellcheck (tests/test_shellcheck.py lints every shell script, e2e/kind/run.sh included;
# it skips without the binary). Debian's package; best effort, like a developer machine.
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "ci-provision: installing shellcheck" >&2
  if ! { apt-get install -y -qq shellcheck >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq shellcheck >/dev/null; }; }; then
    echo "ci-provision: could not install shellcheck; tests/test_shellcheck.py will skip" >&2
  fi
fi
# --- end shellcheck

start=$(date +%s)
python3 e2e/ckpt_e2e/provision.py
echo "ci-provision: control-plane binaries ready in $(( $(date +%s) - start ))s"

# --- agent data plane (issue 5) ------------------------------------------------------------------
# System libraries for the Mooncake transfer engine and iproute2 for `bench fleet`.
bash scripts/install-system-deps.sh
