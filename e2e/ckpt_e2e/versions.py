"""Pinned versions of the control-plane binaries and the Go modules that build them.

Bumping a version here changes the cache directory, so old and new binaries never mix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

KUBERNETES = "v1.37.2"
ETCD = "v3.6.16"
KWOK = "v0.8.0"
HELM = "v3.22.0"
# Prometheus tags its Go module v0.3XX.Y for release 3.XX.Y.
PROMETHEUS = "v0.316.0"
# The LeaderWorkerSet controller (sigs.k8s.io/lws): multi-node replicas as users run them.
LWS = "v0.8.0"


@dataclass(frozen=True)
class Component:
    """One Go wrapper module that builds one or more binaries from a published module."""

    name: str
    module: str
    version: str
    # binary name -> Go package path (inside `module` or its dependencies)
    packages: dict[str, str]
    ldflags: tuple[str, ...] = ()
    # A program of ours (a directory under e2e/ holding go.mod and *.go) instead of a wrapper
    # around a published module; its go.mod pins what it requires.
    source: Path | None = None
    # Go build tags: what a binary leaves out that the tests never use (and a cold build then
    # never compiles).
    tags: tuple[str, ...] = ()


def _k8s_ldflags(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags: list[str] = []
    # Without these the binaries report v0.0.0-master, which breaks version skew checks
    # (kubectl warns, kwok and helm read the server version).
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


def prometheus_release(module_version: str) -> str:
    """The release a Prometheus module tag is: v0.316.0 -> 3.16.0."""
    minor, patch = module_version.lstrip("v").split(".")[1:]
    return f"{int(minor) // 100}.{int(minor) % 100}.{patch}"


def _prometheus_ldflags(version: str) -> tuple[str, ...]:
    # Without this `prometheus --version` and its build_info metric report an empty version.
    return (f"-X github.com/prometheus/common/version.Version={prometheus_release(version)}",)


def source_version(directory: Path) -> str:
    """A cache key for a program of ours: a hash of its go.mod and Go files, so an edit
    rebuilds it and an unchanged one stays cached."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.name == "go.mod" or path.suffix == ".go":
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"src-{digest.hexdigest()[:16]}"


KSTATUS_SOURCE = Path(__file__).resolve().parents[1] / "kstatus"

COMPONENTS: tuple[Component, ...] = (
    Component(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=KUBERNETES,
        packages={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            # The real node beside kwok (realnode.py): built from this same wrapper module, so
            # its version is the control plane's and the shared packages compile once.
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        ldflags=_k8s_ldflags(KUBERNETES),
    ),
    Component(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD,
        # etcd's server module root is itself the `etcd` main package.
        packages={"etcd": "go.etcd.io/etcd/server/v3"},
    ),
    Component(
        name="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK,
        packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK}",),
    ),
    Component(
        name="helm",
        module="helm.sh/helm/v3",
        version=HELM,
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        ldflags=(f"-X helm.sh/helm/v3/internal/version.version={HELM}",),
    ),
    Component(
        name="prometheus",
        module="github.com/prometheus/prometheus",
        version=PROMETHEUS,
        # Monitoring tests only: a real server scraping the operator and agents, and promtool
        # to unit-test the chart's alert rules. The web UI assets are not built in (the
        # `builtinassets` tag needs npm); the HTTP API is all the tests use.
        packages={
            "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
            "promtool": "github.com/prometheus/prometheus/cmd/promtool",
        },
        ldflags=_prometheus_ldflags(PROMETHEUS),
        # The tests discover targets from files only; the cloud and Kubernetes service
        # discoveries are most of Prometheus's dependency tree (and of a cold build's minutes).
        tags=("remove_all_sd",),
    ),
    Component(
        name="lws",
        module="sigs.k8s.io/lws",
        version=LWS,
        # Its manager's main package; the CRD and webhook manifests come from the same module.
        packages={"lws-manager": "sigs.k8s.io/lws/cmd"},
        ldflags=(f"-X sigs.k8s.io/lws/pkg/version.GitVersion={LWS}",),
    ),
    Component(
        name="kstatus",
        module="ckpt-rollout.local/e2e/kstatus",
        version=source_version(KSTATUS_SOURCE),
        # GitOps health tests: what Flux concludes about a CheckpointRollout (its go.mod pins
        # sigs.k8s.io/cli-utils).
        packages={"kstatus": "ckpt-rollout.local/e2e/kstatus"},
        source=KSTATUS_SOURCE,
    ),
)

BINARIES: dict[str, Component] = {b: c for c in COMPONENTS for b in c.packages}
