"""What an agent runs with: its settings (ckpt_agent.settings: flags over a --config file over
defaults) with the pod identity from the downward API (POD_NAME, POD_NAMESPACE, POD_IP)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_agent.engines.sglang import PAUSE_MODES as SGLANG_PAUSE_MODES
from ckpt_agent.formats.synth import ReferenceModelSpec
from ckpt_agent.pipeline.loader import ApplyMode
from ckpt_agent.server.httpserver import ConnectionLimits
from ckpt_agent.settings import AgentSettings
from ckpt_api.source_policy import SourcePolicy

# Engines the agent feeds from a local staging directory (a member stages for its replica
# leader's engine, on its own node).
DISK_ENGINES = ("sglang", "vllm", "member")
DEFAULT_ENGINE_URLS = {"sglang": "http://127.0.0.1:30000", "vllm": "http://127.0.0.1:8000"}


# The settings' defaults are AgentSettings' (ckpt_agent.settings), what the flags and a --config
# file start from; AgentConfig, which code builds directly (tests, benches), starts from them too.
_DEFAULTS = AgentSettings()


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AuthConfig:
    token_file: Path | None = None
    tokenreview_audience: str | None = None
    # The explicit fallback to SubjectAccessReview: these callers may do everything...
    allowed_usernames: tuple[str, ...] = ()
    # ... and these peers (other workers' agents) may read the relay, and only the relay.
    relay_usernames: tuple[str, ...] = ()
    disabled: bool = False

    @property
    def access_review(self) -> bool:
        """TokenReview callers are authorized by SubjectAccessReview unless an allow-list is given."""
        return self.tokenreview_audience is not None and not self.allowed_usernames

    def validate(self) -> None:
        modes = [self.token_file is not None, self.tokenreview_audience is not None, self.disabled]
        if sum(modes) != 1:
            raise ConfigError(
                "choose exactly one of --auth-token-file, --tokenreview-audience or --no-auth "
                "(the agent refuses to start unauthenticated unless told so)"
            )
        if self.allowed_usernames and self.tokenreview_audience is None:
            raise ConfigError("--allowed-usernames needs --tokenreview-audience")
        if self.relay_usernames and not self.allowed_usernames:
            raise ConfigError(
                "--relay-allowed-usernames is part of the --allowed-usernames fallback; with "
                "SubjectAccessReview, RBAC grants peers `get` on agents/relay"
            )


@dataclass(frozen=True)
class TLSConfig:
    """The API port serves HTTPS with these files (re-read when cert-manager or the chart rotate
    them), or plain HTTP when asked for by name; peers are verified against ``peer_ca_file``."""

    cert_file: Path | None = None
    key_file: Path | None = None
    plain_http: bool = False
    peer_ca_file: Path | None = None

    def validate(self, namespace: str | None) -> None:
        serving = self.cert_file is not None or self.key_file is not None
        if serving == self.plain_http:
            raise ConfigError(
                "choose --tls-cert-file with --tls-key-file, or --plain-http (the agent refuses to "
                "serve its API unencrypted unless told so)"
            )
        if serving and (self.cert_file is None or self.key_file is None):
            raise ConfigError("--tls-cert-file and --tls-key-file go together")
        if self.peer_ca_file is not None and not namespace:
            # Peers are verified against their namespace's name, which is this agent's own.
            raise ConfigError("--peer-ca-file needs POD_NAMESPACE in the environment")
        from ckpt_api.tls import TLSFileError, ca_context, server_context

        try:
            if self.cert_file is not None and self.key_file is not None:
                server_context(self.cert_file, self.key_file)
            if self.peer_ca_file is not None:
                ca_context(self.peer_ca_file)
        except TLSFileError as exc:
            raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class AgentConfig:
    host: str = "127.0.0.1"
    port: int = _DEFAULTS.port
    metrics_port: int | None = _DEFAULTS.metrics_port or None  # None: no separate metrics port
    engine: str = _DEFAULTS.engine
    source: str | None = None
    initial_version: str | None = None
    initial_verify: bool = _DEFAULTS.initial_verify
    # Keep WeightsReady False until a rollout confirms this pod serves the version its
    # CheckpointRollout wants (pair with the readiness gate).
    await_rollout: bool = _DEFAULTS.await_rollout
    apply_mode: ApplyMode = _DEFAULTS.apply_mode
    chunk_bytes: int = _DEFAULTS.chunk_mb << 20
    parallelism: int = _DEFAULTS.parallelism
    max_manifest_bytes: int = _DEFAULTS.max_manifest_mb << 20
    model: ReferenceModelSpec = field(default_factory=ReferenceModelSpec)
    # The paddle engine boots a model shaped like this checkpoint (a published version, an HF
    # model directory or one .safetensors file) instead of the reference MLP.
    paddle_weights: Path | None = None
    fastdeploy_url: str = _DEFAULTS.fastdeploy_url
    # Engines that load from a directory (sglang, vllm): their URL and where versions are staged.
    engine_url: str | None = None
    staging_dir: Path | None = None
    ranks: frozenset[int] | None = None  # of a per-rank (sharded_state) version, what this pod pulls
    sglang_load_format: str | None = None
    sglang_pause_mode: str = _DEFAULTS.sglang_pause_mode
    # Files holding the SGLang server's --api-key / --admin-api-key (Kubernetes Secret mounts).
    sglang_api_key_file: Path | None = None
    sglang_admin_api_key_file: Path | None = None
    # The vLLM server's --api-key (a mounted Secret): only the smoke check's /v1 call needs it.
    vllm_api_key_file: Path | None = None
    # FastDeploy answers update_weights within its own 600 s (see ckpt_agent.engines.fastdeploy).
    fastdeploy_update_timeout: float = _DEFAULTS.fastdeploy_update_timeout
    # FastDeploy's --api-key, sent as `Authorization: Bearer`: a file (a mounted Secret), else
    # FastDeploy's own variable FD_API_KEY (its first key), read from the environment.
    fastdeploy_api_key_file: Path | None = None
    # The ranks update_weights must report (None: not checked against a count).
    fastdeploy_ranks: int | None = None
    fastdeploy_api_key: str | None = field(default=None, repr=False)
    # How long a synchronous update_weights (a FastDeploy client's) waits for its load.
    sync_update_timeout: float = _DEFAULTS.sync_update_timeout
    # A load that moves fewer bytes per second than this over a window fails (SourceUnreachable,
    # the previous weights serving; a slow peer is dropped for the source first): per-read
    # timeouts never catch a source that trickles (see ckpt_agent.service.load_watch). 0: off.
    min_load_rate: float = _DEFAULTS.min_load_rate
    load_rate_window: float = _DEFAULTS.load_rate_window
    # Idle/header-read timeout and connection cap of both ports (see ConnectionLimits).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Peer relay: keep the verified copy of the live version and serve it to peers (http);
    # `relay_mooncake` also serves it over Mooncake with that protocol.
    relay: bool = _DEFAULTS.relay
    relay_mooncake: str | None = None
    mooncake_device: str = _DEFAULTS.mooncake_device
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TLSConfig = field(default_factory=TLSConfig)
    # Sources this agent may pull from (ckpt_api.source_policy rules; empty: any); link-local
    # addresses (cloud metadata) are refused unless allowed.
    # This agent's own token for reading peers' relays (a projected token for the agents'
    # audience, re-read per load: the kubelet rotates it). The operator's token, which a
    # request carries, is never sent on to a peer.
    relay_token_file: Path | None = None
    allowed_sources: tuple[str, ...] = ()
    allow_link_local_sources: bool = _DEFAULTS.allow_link_local_sources
    # None: report when running in a cluster (pod identity known and a kube config available).
    report: bool | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None
    report_attempts: int = 5

    def validate(self) -> None:
        self.auth.validate()
        if self.auth.access_review and not self.pod_namespace:
            # The resource reviewed lives in this pod's namespace.
            raise ConfigError(
                "--tokenreview-audience without --allowed-usernames authorizes callers by "
                "SubjectAccessReview in this pod's namespace: set POD_NAMESPACE (downward API)"
            )
        self.tls.validate(self.pod_namespace)
        self._check_relay_token()
        if self.connections.idle_timeout_s <= 0 or self.connections.max_connections < 1:
            raise ConfigError("--idle-timeout and --max-connections must be positive")
        if self.min_load_rate < 0 or self.load_rate_window <= 0:
            raise ConfigError("--min-load-rate must be 0 (off) or more, --load-rate-window positive")
        try:
            self.source_policy()
        except ValueError as exc:
            raise ConfigError(f"--allowed-sources: {exc}") from None
        if self.engine not in ("paddle", "fastdeploy", "null", *DISK_ENGINES):
            raise ConfigError(f"unknown engine {self.engine!r}")
        if self.relay_mooncake not in (None, "tcp", "rdma"):
            raise ConfigError(f"--relay-mooncake must be tcp or rdma, got {self.relay_mooncake!r}")
        if self.report and not (self.pod_name and self.pod_namespace):
            raise ConfigError("--report needs POD_NAME and POD_NAMESPACE in the environment")
        if self.ranks is not None and self.engine not in DISK_ENGINES:
            staging = ", ".join(DISK_ENGINES)
            raise ConfigError(f"--ranks is for the engines that stage a directory ({staging})")
        if self.engine in DISK_ENGINES and self.staging_dir is None:
            raise ConfigError(f"the {self.engine} engine needs --staging-dir (a tmpfs or NVMe path)")
        if self.sglang_pause_mode not in SGLANG_PAUSE_MODES:
            raise ConfigError(f"--sglang-pause-mode must be one of {', '.join(SGLANG_PAUSE_MODES)}")
        if self.engine == "vllm":
            read_secret_file(self.vllm_api_key_file, "--vllm-api-key-file")
        if self.engine == "sglang":
            read_secret_file(self.sglang_api_key_file, "--sglang-api-key-file")
            read_secret_file(self.sglang_admin_api_key_file, "--sglang-admin-api-key-file")
        if self.engine in ("paddle", *DISK_ENGINES) and self.initial_version and not self.source:
            raise ConfigError(f"--initial-version needs --source for the {self.engine} engine")
        if self.engine == "fastdeploy":
            self.fastdeploy_bearer()
        if self.paddle_weights is not None and self.engine != "paddle":
            raise ConfigError("--paddle-weights is for the paddle engine")
        if self.paddle_weights is not None and not self.paddle_weights.exists():
            raise ConfigError(f"--paddle-weights: {self.paddle_weights} does not exist")

    def _check_relay_token(self) -> None:
        """The relay token is sent to peers, any address a request names: it must not be the
        static token that lets its bearer pause and reload this agent."""
        if self.auth.token_file is None or self.relay_token_file is None:
            return
        try:
            same = self.auth.token_file.read_bytes().strip() == self.relay_token_file.read_bytes().strip()
        except OSError:
            return  # read when used, where a missing file is reported (StaticTokenAuthenticator)
        if same:
            raise ConfigError(
                "--relay-token-file holds the --auth-token-file token: peers are sent the relay "
                "token, so it must be another secret (one that reads relays only)"
            )

    def source_policy(self) -> SourcePolicy:
        return SourcePolicy.parse(self.allowed_sources, allow_link_local=self.allow_link_local_sources)

    def fastdeploy_bearer(self) -> str | None:
        """The FastDeploy API key to send, if one is configured (raises ConfigError if its file
        cannot be read or is empty)."""
        from_file = read_secret_file(self.fastdeploy_api_key_file, "--fastdeploy-api-key-file")
        return from_file or self.fastdeploy_api_key or None


def parse_ranks(value: str | None) -> frozenset[int] | None:
    """`--ranks`: comma-separated ranks and ranges (`0-7`, `8,9,12-15`)."""
    if value is None or not value.strip():
        return None
    ranks: set[int] = set()
    for part in value.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise ConfigError(f"--ranks: {part.strip()!r} is not a rank or a range of ranks (0-7)") from None
        if low < 0 or high < low:
            raise ConfigError(f"--ranks: {part.strip()!r} is not a range of ranks from low to high")
        ranks.update(range(low, high + 1))
    return frozenset(ranks)


def read_secret_file(path: Path | None, flag: str) -> str | None:
    """A key from a mounted Secret (surrounding whitespace and the trailing newline dropped)."""
    if path is None:
        return None
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"{flag}: {path} is empty")
    return value


def default_host(env: Mapping[str, str] = os.environ) -> str:
    """The pod IP when known (a pod is reachable there, kwok fake pods included), else loopback."""
    return env.get("POD_IP") or "127.0.0.1"
