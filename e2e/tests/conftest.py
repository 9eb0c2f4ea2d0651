"""Integration tests on a real control plane; fixtures come from the ckpt_e2e plugin."""

from ckpt_e2e.fixtures import cluster, k8s_api, kubectl, namespace, pod_runtime

__all__ = ["cluster", "k8s_api", "kubectl", "namespace", "pod_runtime"]
