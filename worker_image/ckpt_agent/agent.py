"""Composition root: build an agent (engine, service, reporting, auth, app) from its config."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ckpt_agent.common.metrics import AgentMetrics
from ckpt_agent.config import DEFAULT_ENGINE_URLS, DISK_ENGINES, AgentConfig, read_secret_file
from ckpt_agent.engines.base import Engine
from ckpt_agent.pipeline.relay_export import RelayExporter
from ckpt_agent.pipeline.relay_peer import PeerTLS
from ckpt_agent.server.app import create_app, create_metrics_app
from ckpt_agent.server.auth import (
    AccessReviewTarget,
    Authenticator,
    StaticTokenAuthenticator,
    TokenReviewAuthenticator,
)
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.server.kube import kube_config_available, new_api_client
from ckpt_agent.service.reporting import DisabledReporter, KubeReporter, StatusReporter
from ckpt_agent.service.service import AgentService, NoRelayToken, RelayCredential
from ckpt_agent.transport.mooncake.runtime import UNSPECIFIED_HOSTS
from ckpt_api.constants import agent_pod_audience
from ckpt_api.tls import ReloadingContext, agent_server_name, ca_context, listening_context

log = logging.getLogger(__name__)


def relay_credential(config: AgentConfig) -> RelayCredential:
    """What this agent presents to a peer whose relay it reads: its own relay token file, and
    nothing else. Never the token it was called with: a peer is any address a request names,
    and the static token (or the operator's) would let its holder pause and reload this agent.
    Without the file, a load told of a peer reads the source, unless auth is off here (then
    peers are taken to need no credential either)."""
    if config.relay_token_file is not None:
        path = config.relay_token_file

        def own() -> str:
            try:
                token = path.read_text().strip()
            except OSError as exc:
                raise NoRelayToken(f"cannot read --relay-token-file {path} ({exc.strerror})") from None
            if not token:
                raise NoRelayToken(f"--relay-token-file {path} is empty")
            return token

        return own
    if config.auth.disabled:
        return lambda: None

    def none() -> str:
        raise NoRelayToken("this agent has no token for peers (--relay-token-file)")

    return none


def create_engine(config: AgentConfig) -> Engine:
    if config.engine == "null":
        from ckpt_agent.engines.null import NullEngine

        return NullEngine()
    if config.engine in DISK_ENGINES:
        return _disk_engine(config)
    if config.engine == "fastdeploy":
        from ckpt_agent.engines.fastdeploy import FastDeployEngine

        return FastDeployEngine(
            config.fastdeploy_url,
            api_key=config.fastdeploy_bearer(),
            update_timeout=config.fastdeploy_update_timeout,
            max_manifest_bytes=config.max_manifest_bytes,
            ranks=config.fastdeploy_ranks,
        )
    # Only the paddle engine imports paddle (seconds of import time, hundreds of MB).
    from ckpt_agent.engines.paddle_engine import PaddleEngine

    return PaddleEngine(
        config.model,
        boot_weights=config.paddle_weights,
        apply_mode=config.apply_mode,
        chunk_bytes=config.chunk_bytes,
        max_manifest_bytes=config.max_manifest_bytes,
        parallelism=config.parallelism,
        relay=config.relay,
    )


def _disk_engine(config: AgentConfig) -> Engine:
    staging: dict[str, Any] = {
        "chunk_bytes": config.chunk_bytes,
        "max_manifest_bytes": config.max_manifest_bytes,
        "parallelism": config.parallelism,
        "relay": config.relay,
        "ranks": config.ranks,
    }
    assert config.staging_dir is not None  # validated
    if config.engine == "member":
        from ckpt_agent.engines.member import MemberEngine

        return MemberEngine(config.staging_dir, **staging)
    url = config.engine_url or DEFAULT_ENGINE_URLS[config.engine]
    if config.engine == "sglang":
        from ckpt_agent.engines.sglang import SGLangEngine

        return SGLangEngine(
            url,
            config.staging_dir,
            load_format=config.sglang_load_format,
            pause_mode=config.sglang_pause_mode,
            api_key=read_secret_file(config.sglang_api_key_file, "--sglang-api-key-file"),
            admin_api_key=read_secret_file(config.sglang_admin_api_key_file, "--sglang-admin-api-key-file"),
            **staging,
        )
    from ckpt_agent.engines.vllm import VLLMEngine

    return VLLMEngine(
        url,
        config.staging_dir,
        api_key=read_secret_file(config.vllm_api_key_file, "--vllm-api-key-file"),
        **staging,
    )


def never_relays(config: AgentConfig) -> str | None:
    """Why this agent will never serve a relay copy (None: it relays what it loads). Peers are
    told at once, so a reader falls back to the source instead of waiting for it to begin."""
    if not config.relay:
        return "it runs with --no-relay"
    if config.engine in ("fastdeploy", "null"):
        return f"its {config.engine} engine keeps no copy of the weights it loads"
    return None


def _relay_exporter(config: AgentConfig) -> RelayExporter | None:
    from ckpt_agent.transport.mooncake import runtime

    # Mooncake engines (created on first use: reading a mooncake:// source, or relaying) name
    # themselves by the address this agent serves on (the pod IP): peers connect back to it.
    if config.host not in UNSPECIFIED_HOSTS:
        runtime.configure(hostname=config.host)
    runtime.configure(device=config.mooncake_device)
    if not (config.relay and config.relay_mooncake):
        return None
    runtime.check_available()
    return RelayExporter("rdma" if config.relay_mooncake == "rdma" else "tcp")


def peer_tls(config: AgentConfig) -> PeerTLS:
    if config.tls.peer_ca_file is None:
        return PeerTLS()
    assert config.pod_namespace is not None  # validated
    return PeerTLS(ca_context(config.tls.peer_ca_file), agent_server_name(config.pod_namespace))


def api_server(app: web.Application, config: AgentConfig) -> tuple[AppServer, ReloadingContext | None]:
    """The API port's server: HTTPS following its certificate files, or plain HTTP when asked."""
    if config.tls.cert_file is None or config.tls.key_file is None:
        log.warning(
            "the API port serves plain HTTP (--plain-http): tokens and weights cross the wire in clear"
        )
        return AppServer(app, config.host, config.port, limits=config.connections), None
    context, files = listening_context(config.tls.cert_file, config.tls.key_file)
    return AppServer(app, config.host, config.port, context, config.connections), files


@dataclass
class Agent:
    app: web.Application
    service: AgentService
    server: AppServer
    api_client: Any | None
    metrics_server: AppServer | None = None  # the credential-free /metrics port
    tls_files: ReloadingContext | None = None  # the serving certificate the API port follows

    @property
    def metrics_url(self) -> str | None:
        return self.metrics_server.url if self.metrics_server is not None else None

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self) -> None:
        await self.server.start()
        if self.metrics_server is not None:
            await self.metrics_server.start()

    async def stop(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.server.stop()
        if self.api_client is not None:
            await self.api_client.close()


def should_report(config: AgentConfig) -> bool:
    if config.report is not None:
        return config.report
    return bool(config.pod_name and config.pod_namespace and kube_config_available())


async def build_agent(config: AgentConfig) -> Agent:
    config.validate()
    metrics = AgentMetrics()
    report = should_report(config)
    api_client = await new_api_client() if report or config.auth.tokenreview_audience else None
    reporter: StatusReporter = DisabledReporter()
    if report:
        assert config.pod_name is not None
        assert config.pod_namespace is not None
        reporter = KubeReporter(
            api_client, config.pod_name, config.pod_namespace, metrics, attempts=config.report_attempts
        )
    authenticator: Authenticator | None = None
    if config.auth.token_file is not None:
        authenticator = StaticTokenAuthenticator(
            config.auth.token_file, relay_token_file=config.relay_token_file
        )
    elif config.auth.tokenreview_audience is not None:
        target = None
        if config.auth.access_review:
            assert config.pod_namespace is not None  # validated
            target = AccessReviewTarget(config.pod_namespace, config.pod_name)
        audience = config.auth.tokenreview_audience
        authenticator = TokenReviewAuthenticator(
            api_client,
            audience,
            config.auth.allowed_usernames,
            pod_audience=agent_pod_audience(audience, config.pod_name) if config.pod_name else None,
            target=target,
            relay_usernames=config.auth.relay_usernames,
        )
    else:
        log.warning("authentication is OFF (--no-auth): anyone who can reach the port controls the engine")
    engine = create_engine(config)
    service = AgentService(
        engine,
        default_source=config.source,
        reporter=reporter,
        metrics=metrics,
        requires_source=config.engine in ("paddle", *DISK_ENGINES),
        initial_version=config.initial_version,
        initial_verify=config.initial_verify,
        await_rollout=config.await_rollout,
        source_policy=config.source_policy(),
        relay_credential=relay_credential(config),
        peer_tls=peer_tls(config),
        min_load_rate=config.min_load_rate,
        load_rate_window_s=config.load_rate_window,
    )
    app = create_app(
        service,
        authenticator,
        _relay_exporter(config),
        sync_timeout_s=config.sync_update_timeout,
        never_relays=never_relays(config),
    )
    metrics_server = None
    if config.metrics_port is not None:
        # Plain HTTP whatever the API port does: it serves metrics only, to any scraper, with no
        # credential to protect, and Prometheus then needs neither the CA nor the agents' name.
        metrics_server = AppServer(
            create_metrics_app(service), config.host, config.metrics_port, limits=config.connections
        )
    server, tls_files = api_server(app, config)
    return Agent(app, service, server, api_client, metrics_server, tls_files)
