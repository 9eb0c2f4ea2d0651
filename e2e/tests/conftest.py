"""Integration tests on a real control plane; fixtures come from the ckpt_e2e plugin."""

from ckpt_e2e.fixtures import cluster, k8s_api, kubectl, namespace, pod_runtime
from ckpt_e2e.image_fixtures import built_images, pytest_terminal_summary
from ckpt_e2e.providers import provider, scenario_catalog
from ckpt_e2e.realnode_env import real_cluster, real_node_env, real_node_provider
from ckpt_e2e.rollout_fixtures import (
    chart_accounts,
    checkpoint_source,
    crd_installed,
    fleet_factory,
    operator,
    operator_identity,
    rollouts,
)

__all__ = [
    "built_images",
    "chart_accounts",
    "checkpoint_source",
    "cluster",
    "crd_installed",
    "fleet_factory",
    "k8s_api",
    "kubectl",
    "namespace",
    "operator",
    "operator_identity",
    "pod_runtime",
    "provider",
    "pytest_terminal_summary",
    "real_cluster",
    "real_node_env",
    "real_node_provider",
    "rollouts",
    "scenario_catalog",
]
