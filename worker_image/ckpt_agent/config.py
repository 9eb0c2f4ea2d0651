"""Agent settings: flags, with the pod identity from the downward API (POD_NAME, POD_NAMESPACE,
POD_IP)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_agent.loader import ApplyMode
from ckpt_agent.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.reader import DEFAULT_CHUNK_BYTES
from ckpt_agent.synth import ReferenceModelSpec
from ckpt_api.constants import DEFAULT_AGENT_PORT

# Engines the agent feeds from a local staging directory.
DISK_ENGINES = ("sglang", "vllm")
DEFAULT_ENGINE_URLS = {"sglang": "http://127.0.0.1:30000", "vllm": "http://127.0.0.1:8000"}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AuthConfig:
    token_file: Path | None = None
    tokenreview_audience: str | None = None
    allowed_usernames: tuple[str, ...] = ()
    disabled: bool = False

    def validate(self) -> None:
        modes = [self.token_file is not None, self.tokenreview_audience is not None, self.disabled]
        if sum(modes) != 1:
            raise ConfigError(
                "choose exactly one of --auth-token-file, --tokenreview-audience or --no-auth "
                "(the agent refuses to start unauthenticated unless told so)"
            )
        if self.tokenreview_audience is not None and not self.allowed_usernames:
            raise ConfigError("--tokenreview-audience needs --allowed-usernames")


@dataclass(frozen=True)
class AgentConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_AGENT_PORT
    engine: str = "paddle"
    source: str | None = None
    initial_version: str | None = None
    initial_verify: bool = True
    # Keep WeightsReady False until a rollout confirms this pod serves the version its
    # CheckpointRollout wants (pair with the readiness gate).
    await_rollout: bool = False
    apply_mode: ApplyMode = "staged"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    parallelism: int = 1
    max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES
    model: ReferenceModelSpec = field(default_factory=ReferenceModelSpec)
    fastdeploy_url: str = "http://127.0.0.1:8000"
    # Engines that load from a directory (sglang, vllm): their URL and where versions are staged.
    engine_url: str | None = None
    staging_dir: Path | None = None
    sglang_load_format: str | None = None
    fastdeploy_update_timeout: float = 1800.0
    # Peer relay: keep the verified copy of the live version and serve it to peers (http);
    # `relay_mooncake` also serves it over Mooncake with that protocol.
    relay: bool = True
    relay_mooncake: str | None = None
    mooncake_device: str = ""
    auth: AuthConfig = field(default_factory=AuthConfig)
    # None: report when running in a cluster (pod identity known and a kube config available).
    report: bool | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None
    report_attempts: int = 5

    def validate(self) -> None:
        self.auth.validate()
        if self.engine not in ("paddle", "fastdeploy", "null", *DISK_ENGINES):
            raise ConfigError(f"unknown engine {self.engine!r}")
        if self.relay_mooncake not in (None, "tcp", "rdma"):
            raise ConfigError(f"--relay-mooncake must be tcp or rdma, got {self.relay_mooncake!r}")
        if self.report and not (self.pod_name and self.pod_namespace):
            raise ConfigError("--report needs POD_NAME and POD_NAMESPACE in the environment")
        if self.engine in DISK_ENGINES and self.staging_dir is None:
            raise ConfigError(f"the {self.engine} engine needs --staging-dir (a tmpfs or NVMe path)")
        if self.engine in ("paddle", *DISK_ENGINES) and self.initial_version and not self.source:
            raise ConfigError(f"--initial-version needs --source for the {self.engine} engine")


def default_host(env: Mapping[str, str] = os.environ) -> str:
    """The pod IP when known (a pod is reachable there, kwok fake pods included), else loopback."""
    return env.get("POD_IP") or "127.0.0.1"
