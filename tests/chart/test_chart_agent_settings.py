"""agentSettings: one ConfigMap of agent settings per worker namespace, checked by the agent's own
schema at `helm template` and read back by the agent's model."""

from __future__ import annotations

import yaml
from chart_render import Helm

from ckpt_agent.settings import AgentSettings

SETTINGS = {
    "engine": "sglang",
    "chunk_mb": 8,
    "allowed_sources": ["http://ckpt-store:8090"],
    "no_auth": False,
}
WORKERS = {"enabled": True, "namespaces": ["rl-a", "rl-b"]}


def test_each_worker_namespace_gets_the_settings_the_agent_reads(helm: Helm) -> None:
    rendered = helm.template({"workerRbac": WORKERS, "agentSettings": SETTINGS})
    for namespace in WORKERS["namespaces"]:
        config_map = rendered.one("ConfigMap", "ckpt-rollout-agent", namespace)
        text = config_map["data"]["agent.yaml"]
        assert AgentSettings.model_validate(yaml.safe_load(text)) == AgentSettings.model_validate(SETTINGS)


def test_no_settings_is_an_empty_file_the_agent_accepts(helm: Helm) -> None:
    config_map = helm.template({"workerRbac": {"enabled": True}}).one(
        "ConfigMap", "ckpt-rollout-agent", "ops"
    )
    assert yaml.safe_load(config_map["data"]["agent.yaml"]) == {}


def test_without_worker_rbac_there_is_no_settings_config_map(helm: Helm) -> None:
    rendered = helm.template({"agentSettings": SETTINGS})
    assert not [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"] == "ckpt-rollout-agent"]


def test_a_key_or_type_the_agent_refuses_fails_the_render(helm: Helm) -> None:
    assert "chunk_mbs" in helm.template_error({"workerRbac": WORKERS, "agentSettings": {"chunk_mbs": 8}})
    assert "chunk_mb" in helm.template_error({"workerRbac": WORKERS, "agentSettings": {"chunk_mb": "8"}})
    assert "engine" in helm.template_error({"agentSettings": {"engine": "tensorrt"}})
