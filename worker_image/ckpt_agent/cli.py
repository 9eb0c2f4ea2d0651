"""Subcommands the agent package contributes to `ckpt-rollout` (publish, serve, agent). Each
handler imports its implementation lazily so `--help` stays fast and works without paddle."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_agent.common.logformat import FORMATS, setup_logging
from ckpt_api.constants import DEFAULT_AGENT_METRICS_PORT, DEFAULT_AGENT_PORT

if TYPE_CHECKING:
    from ckpt_agent.formats.manifest import OutputReference

SubParsers = Any  # argparse._SubParsersAction is private; this is what add_parser is called on

DEFAULT_SOURCE_PORT = 8090


def _setup_logging(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Configures logging; returns how to announce the server's URL (None: print it)."""
    setup_logging(args.log_level, args.log_format)
    # In JSON, every line of the process is an object, the "listening on" one included.
    return logging.getLogger("ckpt_agent").info if args.log_format == "json" else None


def _add_logging_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("CKPT_LOG_FORMAT", "text"),
        help="json: one object per line, the operator's fields (timestamp, severity, message); "
        "env CKPT_LOG_FORMAT",
    )


def _add_model_shape_arguments(p: argparse.ArgumentParser, context: str) -> None:
    """The paddle reference model's shape: the agent builds it, `publish --example` fills it."""
    p.add_argument("--model-hidden", type=int, default=64, help=f"{context}reference model width")
    p.add_argument("--model-layers", type=int, default=2, help=f"{context}reference model depth")
    p.add_argument("--model-outputs", type=int, default=8, help=f"{context}reference model outputs")


# -- publish ---------------------------------------------------------------------------------------
def _publish(args: argparse.Namespace) -> int:
    import tempfile

    from ckpt_agent.source.publish import PublishError, read_reference

    if (args.src is None) == (args.example is None):
        print("ckpt-rollout publish: give SRC or --example SEED (one of the two)", file=sys.stderr)
        return 2
    try:
        reference = None if args.reference is None else read_reference(Path(args.reference))
    except PublishError as exc:
        print(f"ckpt-rollout publish: {exc}", file=sys.stderr)
        return 1
    if args.src is not None:
        return _publish_from(args, Path(args.src), reference)
    from ckpt_agent.formats.synth import ReferenceModelSpec, published_reference, write_reference_checkpoint

    # The reference engine's weights for this seed, and what its smoke check must see with them.
    spec = ReferenceModelSpec(args.model_hidden, args.model_layers, args.model_outputs)
    with tempfile.TemporaryDirectory(prefix="ckpt-example-") as scratch:
        write_reference_checkpoint(scratch, args.example, spec)
        return _publish_from(args, Path(scratch), reference or published_reference(spec, args.example))


def _publish_from(args: argparse.Namespace, src: Path, reference: OutputReference | None) -> int:
    import json

    from ckpt_agent.source.publish import PublishError, publish_version
    from ckpt_agent.source.publish.progress import Bar, Lines, Reporter

    # A terminal gets a live bar; logs and CI get one line per file, both on stderr so stdout
    # stays the digest (or the --json summary) that scripts read.
    reporter: Reporter = Bar(f"publish {args.version}") if sys.stderr.isatty() else Lines()
    try:
        result = publish_version(
            src,
            args.version,
            Path(args.out),
            shard_bytes=args.shard_mb << 20,
            link=args.link,
            threads=args.threads,
            reporter=reporter,
            reference=reference,
        )
    except PublishError as exc:
        print(f"ckpt-rollout publish: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ckpt-rollout publish: interrupted; nothing was published", file=sys.stderr)
        return 130
    print(json.dumps(result.to_json(), indent=1) if args.json else result.digest)
    return 0


# -- serve -----------------------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> int:
    from ckpt_agent.server.httpserver import AppServer, serve_until_signalled
    from ckpt_agent.source.serve import create_source_app

    announce = _setup_logging(args)
    root = Path(args.root)
    if not root.is_dir():
        print(f"ckpt-rollout serve: {root} is not a directory", file=sys.stderr)
        return 1
    exports = None
    if args.mooncake:
        from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
        from ckpt_agent.transport.mooncake import runtime
        from ckpt_agent.transport.mooncake.export import directory_exports

        hostname = args.mooncake_host or args.host
        if hostname in runtime.UNSPECIFIED_HOSTS:
            print(
                "ckpt-rollout serve: --mooncake needs --mooncake-host (the address agents reach)",
                file=sys.stderr,
            )
            return 2
        runtime.configure(hostname=hostname, device=args.mooncake_device)
        try:
            engine = runtime.engine_for(args.mooncake)
        except runtime.MooncakeUnavailable as exc:
            print(f"ckpt-rollout serve: {exc}", file=sys.stderr)
            return 1
        exports = directory_exports(engine, root, DEFAULT_MAX_MANIFEST_BYTES, keep=args.mooncake_keep)
    server = AppServer(create_source_app(root, exports), args.host, args.port)
    asyncio.run(serve_until_signalled(server, f"serving {root} on", announce))
    return 0


# -- agent -----------------------------------------------------------------------------------------
def config_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Any:
    from ckpt_agent.config import AgentConfig, AuthConfig, TLSConfig, default_host
    from ckpt_agent.formats.synth import ReferenceModelSpec

    environ = dict(os.environ) if env is None else env
    usernames = tuple(u.strip() for u in (args.allowed_usernames or "").split(",") if u.strip())
    return AgentConfig(
        host=args.host or default_host(environ),
        port=args.port,
        metrics_port=args.metrics_port or None,
        engine=args.engine,
        source=args.source,
        initial_version=args.initial_version,
        initial_verify=args.initial_verify,
        await_rollout=args.await_rollout,
        apply_mode=args.apply_mode,
        chunk_bytes=args.chunk_mb << 20,
        parallelism=args.parallelism,
        max_manifest_bytes=args.max_manifest_mb << 20,
        model=ReferenceModelSpec(
            hidden=args.model_hidden, layers=args.model_layers, outputs=args.model_outputs
        ),
        paddle_weights=Path(args.paddle_weights) if args.paddle_weights else None,
        relay=args.relay,
        relay_mooncake=args.relay_mooncake,
        mooncake_device=args.mooncake_device,
        fastdeploy_url=args.fastdeploy_url,
        engine_url=args.engine_url,
        staging_dir=Path(args.staging_dir) if args.staging_dir else None,
        sglang_load_format=args.sglang_load_format,
        sglang_pause_mode=args.sglang_pause_mode,
        sglang_api_key_file=Path(args.sglang_api_key_file) if args.sglang_api_key_file else None,
        vllm_api_key_file=Path(args.vllm_api_key_file) if args.vllm_api_key_file else None,
        sglang_admin_api_key_file=(
            Path(args.sglang_admin_api_key_file) if args.sglang_admin_api_key_file else None
        ),
        fastdeploy_update_timeout=_or_default(args.fastdeploy_update_timeout, "fastdeploy_update_timeout"),
        fastdeploy_api_key_file=Path(args.fastdeploy_api_key_file) if args.fastdeploy_api_key_file else None,
        # FastDeploy reads FD_API_KEY as comma-separated keys and accepts any; one is enough.
        fastdeploy_api_key=environ.get("FD_API_KEY", "").split(",")[0].strip() or None,
        sync_update_timeout=_or_default(args.sync_update_timeout, "sync_update_timeout"),
        min_load_rate=_or_default(args.min_load_rate, "min_load_rate"),
        load_rate_window=_or_default(args.load_rate_window, "load_rate_window"),
        connections=_connection_limits(args),
        auth=AuthConfig(
            token_file=Path(args.auth_token_file) if args.auth_token_file else None,
            tokenreview_audience=args.tokenreview_audience,
            allowed_usernames=usernames,
            relay_usernames=tuple(
                u.strip() for u in (args.relay_allowed_usernames or "").split(",") if u.strip()
            ),
            disabled=args.no_auth,
        ),
        tls=TLSConfig(
            cert_file=Path(args.tls_cert_file) if args.tls_cert_file else None,
            key_file=Path(args.tls_key_file) if args.tls_key_file else None,
            plain_http=args.plain_http,
            peer_ca_file=Path(args.peer_ca_file) if args.peer_ca_file else None,
        ),
        relay_token_file=Path(args.relay_token_file) if args.relay_token_file else None,
        allowed_sources=tuple(s for s in (args.allowed_sources or "").split(",") if s.strip()),
        allow_link_local_sources=args.allow_link_local_sources,
        report=args.report,
        pod_name=environ.get("POD_NAME") or None,
        pod_namespace=environ.get("POD_NAMESPACE") or None,
    )


def _connection_limits(args: argparse.Namespace) -> Any:
    from ckpt_agent.server.httpserver import ConnectionLimits

    default = ConnectionLimits()
    return ConnectionLimits(
        idle_timeout_s=default.idle_timeout_s if args.idle_timeout is None else args.idle_timeout,
        max_connections=default.max_connections if args.max_connections is None else args.max_connections,
    )


def _or_default(value: float | None, name: str) -> float:
    """A flag left unset takes AgentConfig's default, which says why it is what it is."""
    from ckpt_agent.config import AgentConfig

    return float(getattr(AgentConfig, name)) if value is None else value


async def _agent_main(config: Any, announce: Callable[[str], None] | None) -> None:
    from ckpt_agent.agent import build_agent
    from ckpt_agent.server.httpserver import serve_until_signalled

    agent = await build_agent(config)
    try:
        if agent.metrics_server is not None:  # the credential-free /metrics port, for Prometheus
            await agent.metrics_server.start()
        await serve_until_signalled(agent.server, f"ckpt-agent ({config.engine}) listening on", announce)
    finally:
        if agent.metrics_server is not None:
            await agent.metrics_server.stop()
        if agent.api_client is not None:
            await agent.api_client.close()


def _missing_engine_package(engine: str) -> str | None:
    """The slim worker image has no paddle: say so before the engine's import fails deep inside."""
    import importlib.util

    if engine == "paddle" and importlib.util.find_spec("paddle") is None:
        return (
            "--engine paddle needs paddle, which is not installed here: pip install 'ckpt-rollout[paddle]' "
            "or use the worker image's cpu/gpu variant (the slim one serves fastdeploy, sglang, vllm)"
        )
    return None


def _agent(args: argparse.Namespace) -> int:
    from ckpt_agent.config import ConfigError

    announce = _setup_logging(args)
    config = config_from_args(args)
    try:
        config.validate()
    except ConfigError as exc:
        print(f"ckpt-rollout agent: {exc}", file=sys.stderr)
        return 2
    if missing := _missing_engine_package(config.engine):
        print(f"ckpt-rollout agent: {missing}", file=sys.stderr)
        return 2
    from ckpt_agent.engines.boot_checkpoint import BootCheckpointError
    from ckpt_agent.engines.disk_staged import EngineMisconfigured

    try:
        asyncio.run(_agent_main(config, announce))
    except (ConfigError, EngineMisconfigured, BootCheckpointError) as exc:
        # A key file that cannot be read, an engine that cannot do what the agent needs, or
        # boot weights the engine cannot hold.
        print(f"ckpt-rollout agent: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_agent_parser(sub: SubParsers) -> None:
    p = sub.add_parser("agent", help="run the worker agent (weight loads, FastDeploy-style control API)")
    p.add_argument("--host", default=None, help="bind address (default: $POD_IP, else 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_AGENT_PORT)
    p.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_AGENT_METRICS_PORT,
        help="GET /metrics without credentials, for Prometheus (0: none; the control port's "
        "/metrics keeps asking for the operator's token)",
    )
    p.add_argument(
        "--engine",
        choices=["paddle", "fastdeploy", "null", "sglang", "vllm"],
        default="paddle",
        help="null: loads apply instantly, nothing is pulled (scale tests and benches)",
    )
    p.add_argument("--source", help="default checkpoint source: http(s)://host:port[/prefix] or file:///path")
    p.add_argument("--initial-version", help="version to load at startup (paddle) or that the engine serves")
    p.add_argument(
        "--initial-verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="verify the initial load",
    )
    p.add_argument(
        "--await-rollout",
        action="store_true",
        help="keep WeightsReady False until a CheckpointRollout confirms this pod's version "
        "(use with the readiness gate: a new pod is not Ready before it serves the stable version)",
    )
    p.add_argument("--apply-mode", choices=["staged", "streamed"], default="staged")
    p.add_argument("--chunk-mb", type=int, default=4, help="read size per transport call")
    p.add_argument("--parallelism", type=int, default=1, help="concurrent streams for staged loads")
    p.add_argument("--max-manifest-mb", type=int, default=64)
    _add_model_shape_arguments(p, "")
    p.add_argument(
        "--paddle-weights",
        metavar="PATH",
        help="boot the paddle engine with a model shaped like this checkpoint (a published version "
        "directory, a Hugging Face model directory or one .safetensors file) instead of the reference "
        "MLP; later versions must match its tensor names, dtypes and shapes; no /v1/infer",
    )
    p.add_argument(
        "--relay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the verified copy of the live version (staged: its host staging arena) and serve it "
        "to peers under /v1/relay (peer relay)",
    )
    p.add_argument("--relay-mooncake", choices=["tcp", "rdma"], help="also relay over Mooncake")
    p.add_argument("--mooncake-device", default="", help="RDMA devices for Mooncake (default: discover)")
    p.add_argument("--fastdeploy-url", default="http://127.0.0.1:8000")
    p.add_argument("--engine-url", help="sglang/vllm server (default http://127.0.0.1:30000 / :8000)")
    p.add_argument("--staging-dir", help="where sglang/vllm versions are staged (tmpfs or NVMe path)")
    p.add_argument(
        "--sglang-load-format",
        help="load_format sent to SGLang's update_weights_from_disk (default: the server's own; "
        "needed, e.g. auto, when SGLang runs --load-format dummy)",
    )
    p.add_argument(
        "--sglang-pause-mode",
        choices=["abort", "retract", "in_place"],
        default="abort",
        help="how SGLang pauses for a load: abort in-flight requests (default: every response from one "
        "version), retract them (recomputed after the load), or in_place (keeps their KV cache; the "
        "radix cache is then not flushed)",
    )
    p.add_argument("--sglang-api-key-file", help="file holding the SGLang server's --api-key")
    p.add_argument(
        "--vllm-api-key-file",
        help="file holding the vLLM server's --api-key (its /v1 routes, which the smoke check calls)",
    )
    p.add_argument(
        "--sglang-admin-api-key-file",
        help="file holding the SGLang server's --admin-api-key (sent to its pause/update/continue routes)",
    )
    p.add_argument(
        "--fastdeploy-update-timeout",
        type=float,
        help="seconds to wait for FastDeploy's update_weights (default 630: FastDeploy's API server "
        "gives up after 600 s and answers itself)",
    )
    p.add_argument(
        "--fastdeploy-api-key-file",
        help="file holding FastDeploy's --api-key, sent as a bearer token (default: $FD_API_KEY)",
    )
    p.add_argument(
        "--sync-update-timeout",
        type=float,
        help="seconds a synchronous update_weights (no rollout, no Prefer: respond-async) waits for "
        "its load (default 600, FastDeploy's own wait); the load goes on after",
    )
    p.add_argument(
        "--min-load-rate",
        type=float,
        help="bytes per second a load must average over --load-rate-window, or it fails "
        "(SourceUnreachable; the previous weights serve, the engine resumes); a peer that slow is "
        "dropped for the source first. Per-read timeouts never catch a source that trickles "
        "(default 1048576; 0: off)",
    )
    p.add_argument(
        "--load-rate-window",
        type=float,
        help="seconds over which --min-load-rate is judged, and the grace a load gets before it is "
        "first judged (default 30)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        help="seconds a connection may stay open without a complete request head, from its "
        "opening or its last response (the header-read and keep-alive timeout; default 30)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        help="open connections per port; past this a connection is answered 503 and closed (default 256)",
    )
    p.add_argument("--auth-token-file", help="accept the bearer token stored in this file")
    p.add_argument(
        "--tokenreview-audience",
        help="check bearer tokens with TokenReview for this audience (pass "
        "ckpt-rollout-agent/$(POD_NAMESPACE): peers present it) or, with POD_NAME set, for "
        "AUDIENCE/POD_NAME (what the operator mints for this agent alone); then authorize "
        "each caller by SubjectAccessReview in POD_NAMESPACE: `update` agents.rollout.ckpt.dev "
        "(named POD_NAME) for control calls, `get` for reads, `get` agents/relay for the relay",
    )
    p.add_argument(
        "--allowed-usernames",
        help="fallback to SubjectAccessReview: only these callers (comma-separated, e.g. "
        "system:serviceaccount:ns:operator) may call, and may do everything",
    )
    p.add_argument("--no-auth", action="store_true", help="no authentication (local development only)")
    p.add_argument(
        "--relay-allowed-usernames",
        help="with --allowed-usernames: comma-separated peers that may read this agent's relay and "
        "nothing else, e.g. system:serviceaccount:ns:ckpt-rollout-worker",
    )
    p.add_argument(
        "--relay-token-file",
        help="this agent's own token for reading peers' relays (a projected token for the agents' "
        "audience; with --auth-token-file, a relay-only secret the agents share, which this agent "
        "also accepts for its relay and nothing else); without it, and with auth on, peers are "
        "skipped for the source: the token a request carries is never sent on",
    )
    p.add_argument(
        "--tls-cert-file",
        help="serve the API port over HTTPS with this certificate (PEM, chain first; re-read when "
        "it changes: new connections get the rotated one)",
    )
    p.add_argument("--tls-key-file", help="the private key of --tls-cert-file (PEM)")
    p.add_argument(
        "--plain-http",
        action="store_true",
        help="serve the API port over plain HTTP (local development only; without it the agent needs "
        "--tls-cert-file and --tls-key-file)",
    )
    p.add_argument(
        "--peer-ca-file",
        help="CA bundle that peers' certificates must chain to (verified for the name "
        "ckpt-rollout-agent.$POD_NAMESPACE.svc); an https peer failing it is skipped for the source",
    )
    p.add_argument(
        "--allowed-sources",
        help="comma-separated rules scheme://host[:port][/path] a source must match (host: a name, "
        "*.domain, * or a CIDR; file:///path for a directory tree); default: any source",
    )
    p.add_argument(
        "--allow-link-local-sources",
        action="store_true",
        help="let sources resolve to link-local addresses (169.254.0.0/16, fe80::/10: cloud metadata)",
    )
    p.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write status.workers.<pod> and the WeightsReady condition (default: when in a cluster)",
    )
    _add_logging_arguments(p)
    p.set_defaults(func=_agent)


def add_commands(sub: SubParsers) -> None:
    """Register `publish`, `serve` and `agent` on the `ckpt-rollout` subparsers."""
    p = sub.add_parser(
        "publish", help="publish a checkpoint version (shards, every other file of it, a manifest)"
    )
    p.add_argument(
        "src",
        metavar="SRC",
        nargs="?",
        help="a Hugging Face model directory (*.safetensors, index, config, tokenizer...), "
        "one .safetensors file, or a paddle state dict file",
    )
    p.add_argument(
        "--example",
        type=int,
        metavar="SEED",
        help="instead of SRC: weights of the paddle reference engine (`--engine=paddle`) drawn "
        "from SEED, with its smoke-check reference; tensors layers.<i>.weight [hidden, hidden], "
        "layers.<i>.bias [hidden], head.weight [hidden, outputs], head.bias [outputs], float32",
    )
    _add_model_shape_arguments(p, "--example: as the agent's ")
    p.add_argument("--version", required=True, help="version name, e.g. global_step_1200")
    p.add_argument("--out", required=True, metavar="ROOT", help="root of the published tree")
    p.add_argument("--shard-mb", type=int, default=4096, help="shard size when writing a state dict")
    p.add_argument(
        "--link",
        action="store_true",
        help="hard-link source files into the version (else reflink, else copy): publishing on "
        "the same filesystem costs hashing only; the source must never be modified afterwards",
    )
    p.add_argument("--threads", type=int, default=None, help="hashing threads (default: one per core)")
    p.add_argument(
        "--reference",
        metavar="FILE",
        help="JSON {outputs: [numbers], atol: number}: what the paddle reference model answers on "
        "its fixed input with these weights, written into the manifest for the smoke check",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the digest")
    p.set_defaults(func=_publish)

    p = sub.add_parser("serve", help="serve published versions over http (range requests, sendfile)")
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_SOURCE_PORT)
    p.add_argument(
        "--mooncake",
        choices=["tcp", "rdma"],
        help="also serve over the Mooncake transfer engine (agents use mooncake://host:port)",
    )
    p.add_argument("--mooncake-host", help="address agents reach the engine at (default: --host)")
    p.add_argument("--mooncake-device", default="", help="RDMA devices (default: discover)")
    p.add_argument("--mooncake-keep", type=int, default=4, help="versions kept registered")
    _add_logging_arguments(p)
    p.set_defaults(func=_serve)

    _add_agent_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    """Standalone parser for `python -m ckpt_agent` (the worker image's entrypoint)."""
    parser = argparse.ArgumentParser(prog="ckpt-agent", description="ckpt-rollout worker agent and tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
