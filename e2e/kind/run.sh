#!/usr/bin/env bash
# The kind path (for users with Docker): the scenario suite, e2e/tests/test_scenarios.py, against
# a kind cluster running what users run - the operator and worker images built from this tree,
# the Helm chart, an in-cluster checkpoint source. CI runs the same suite on the local control
# plane instead (no Docker there); only the cluster provider differs (e2e/ckpt_e2e/providers.py).
#
#   e2e/kind/run.sh                      create, build, load, install, test, delete the cluster
#   KEEP_CLUSTER=1 e2e/kind/run.sh       keep the cluster (a second run reuses it)
#   e2e/kind/run.sh -k abort -x          arguments after the script go to pytest
#
# Needs docker (with an engine) and kind on PATH. kubectl and helm are the project's pinned
# ones (make provision: cache, else built from Go modules), the Python env is `make install`'s.
# Settings: CLUSTER_NAME (ckpt-e2e), KIND_NODE_IMAGE (kind's default), KEEP_CLUSTER (0),
# STATE_DIR (.kind: kubeconfig and logs), VENV (.venv).
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER_NAME="${CLUSTER_NAME:-ckpt-e2e}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
STATE_DIR="${STATE_DIR:-.kind}"
VENV="${VENV:-.venv}"
# Names the chart values (e2e/kind/values.yaml), the source manifest and the providers' defaults
# agree on.
OPERATOR_IMAGE=ckpt-rollout-operator:e2e
WORKER_IMAGE=ckpt-rollout-worker:e2e
RELEASE=ckpt-rollout
SYSTEM_NS=ckpt-rollout-system
SOURCE_NS=ckpt-e2e

say() { printf '==> %s\n' "$*"; }
die() {
  printf 'e2e/kind/run.sh: %s\n' "$*" >&2
  exit 1
}
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not on PATH: $2"; }

need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
docker info >/dev/null 2>&1 || die "docker cannot reach an engine (docker info failed)"
mkdir -p "$STATE_DIR"
KUBECONFIG_FILE="$(cd "$STATE_DIR" && pwd)/kubeconfig"

say "python env and pinned kubectl/helm (shared with the local path: make install, make provision)"
make install
tools=$(python3 e2e/ckpt_e2e/provision.py kubectl helm)
KUBECTL=$(awk -F'\t' '$1 == "kubectl" {print $2}' <<<"$tools")
HELM=$(awk -F'\t' '$1 == "helm" {print $2}' <<<"$tools")
if [ -z "$KUBECTL" ] || [ -z "$HELM" ]; then
  die "provision.py did not name kubectl and helm: $tools"
fi
kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
helm() { "$HELM" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

cleanup() {
  if [ "$KEEP_CLUSTER" = 1 ]; then
    say "kept kind cluster $CLUSTER_NAME: export KUBECONFIG=$KUBECONFIG_FILE"
  else
    say "deleting kind cluster $CLUSTER_NAME"
    kind delete cluster --name "$CLUSTER_NAME" || true
  fi
}

say "kind cluster $CLUSTER_NAME"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  kind get kubeconfig --name "$CLUSTER_NAME" >"$KUBECONFIG_FILE"
else
  create=(kind create cluster --name "$CLUSTER_NAME" --config e2e/kind/cluster.yaml
    --kubeconfig "$KUBECONFIG_FILE" --wait 180s)
  if [ -n "${KIND_NODE_IMAGE:-}" ]; then
    create+=(--image "$KIND_NODE_IMAGE")
  fi
  "${create[@]}"
fi
trap cleanup EXIT

say "building $OPERATOR_IMAGE and $WORKER_IMAGE (CPU paddle)"
docker build -f operator/Dockerfile -t "$OPERATOR_IMAGE" .
docker build -f worker_image/Dockerfile --build-arg PADDLE=cpu --build-arg MOONCAKE=cpu -t "$WORKER_IMAGE" .
kind load docker-image --name "$CLUSTER_NAME" "$OPERATOR_IMAGE" "$WORKER_IMAGE"

say "helm chart (README's install, with e2e/kind/values.yaml)"
helm upgrade --install "$RELEASE" charts/ckpt-rollout --namespace "$SYSTEM_NS" --create-namespace \
  --values e2e/kind/values.yaml --wait --timeout 5m

say "checkpoint source: the scenario catalog (e2e/ckpt_e2e/catalog.py) served in-cluster"
kubectl create namespace "$SOURCE_NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl create configmap ckpt-e2e-catalog --namespace "$SOURCE_NS" \
  --from-file=catalog.py=e2e/ckpt_e2e/catalog.py --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f e2e/kind/manifests/source.yaml
kubectl rollout status deployment/ckpt-src --namespace "$SOURCE_NS" --timeout 10m

say "scenario suite against $CLUSTER_NAME"
# The providers' defaults name what was installed above; listed for readers and other clusters.
CKPT_E2E_KUBECONFIG="$KUBECONFIG_FILE" \
  CKPT_E2E_WORKER_IMAGE="$WORKER_IMAGE" \
  CKPT_E2E_SOURCE_URL="http://ckpt-src.$SOURCE_NS.svc:8080" \
  CKPT_E2E_OPERATOR_NAMESPACE="$SYSTEM_NS" \
  CKPT_E2E_OPERATOR_RELEASE="$RELEASE" \
  CKPT_E2E_KUBECTL="$KUBECTL" \
  CKPT_E2E_HELM="$HELM" \
  "$VENV/bin/pytest" e2e/tests/test_scenarios.py -m scenario "$@"
