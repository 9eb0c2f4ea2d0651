"""Subcommands the agent package contributes to `ckpt-rollout` (publish, serve, agent). Each
handler imports its implementation lazily so `--help` stays fast and works without paddle."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_agent.common.logformat import FORMATS, setup_logging
from ckpt_api import process_runtime

if TYPE_CHECKING:
    from ckpt_agent.settings import AgentSettings
    from ckpt_api.manifest import ReferenceRecord

SubParsers = Any  # argparse._SubParsersAction is private; this is what add_parser is called on

DEFAULT_SOURCE_PORT = 8090


def _setup_logging(level: str, log_format: str) -> Callable[[str], None] | None:
    """Configures logging; returns how to announce the server's URL (None: print it)."""
    setup_logging(level, log_format)
    # In JSON, every line of the process is an object, the "listening on" one included.
    return logging.getLogger("ckpt_agent").info if log_format == "json" else None


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

    from ckpt_source.publish import PublishError, read_reference

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


def _publish_from(args: argparse.Namespace, src: Path, reference: ReferenceRecord | None) -> int:
    import json

    from ckpt_source.publish import PublishError, publish_version
    from ckpt_source.publish.progress import Bar, Lines, Reporter

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
            digest=args.digest,
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

    announce = _setup_logging(args.log_level, args.log_format)
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
    process_runtime.freeze_start_up()
    process_runtime.run(serve_until_signalled(server, f"serving {root} on", announce))
    return 0


# -- agent -----------------------------------------------------------------------------------------
def agent_settings(args: argparse.Namespace, env: Mapping[str, str]) -> AgentSettings:
    """The flags given on this command line over `--config FILE` over the model's defaults."""
    from ckpt_agent.settings import given_flags, load_settings

    path = getattr(args, "config", None)
    return load_settings(Path(path) if path else None, given_flags(args), env)


def config_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Any:
    environ = dict(os.environ) if env is None else env
    return config_from_settings(agent_settings(args, environ), args.host, environ)


def config_from_settings(settings: AgentSettings, host: str | None, environ: Mapping[str, str]) -> Any:
    from ckpt_agent.config import AgentConfig, AuthConfig, TLSConfig, default_host, parse_ranks
    from ckpt_agent.formats.synth import ReferenceModelSpec
    from ckpt_agent.server.httpserver import ConnectionLimits

    s = settings
    return AgentConfig(
        host=host or default_host(environ),
        port=s.port,
        metrics_port=s.metrics_port or None,
        engine=s.engine,
        source=s.source,
        initial_version=s.initial_version,
        initial_verify=s.initial_verify,
        await_rollout=s.await_rollout,
        apply_mode=s.apply_mode,
        chunk_bytes=s.chunk_mb << 20,
        parallelism=s.parallelism,
        max_manifest_bytes=s.max_manifest_mb << 20,
        model=ReferenceModelSpec(hidden=s.model_hidden, layers=s.model_layers, outputs=s.model_outputs),
        paddle_weights=s.paddle_weights,
        relay=s.relay,
        relay_mooncake=s.relay_mooncake,
        mooncake_device=s.mooncake_device,
        fastdeploy_url=s.fastdeploy_url,
        engine_url=s.engine_url,
        staging_dir=s.staging_dir,
        ranks=parse_ranks(s.ranks),
        sglang_load_format=s.sglang_load_format,
        sglang_pause_mode=s.sglang_pause_mode,
        sglang_api_key_file=s.sglang_api_key_file,
        vllm_api_key_file=s.vllm_api_key_file,
        sglang_admin_api_key_file=s.sglang_admin_api_key_file,
        fastdeploy_update_timeout=s.fastdeploy_update_timeout,
        fastdeploy_api_key_file=s.fastdeploy_api_key_file,
        fastdeploy_ranks=s.fastdeploy_ranks,
        # FastDeploy reads FD_API_KEY as comma-separated keys and accepts any; one is enough.
        fastdeploy_api_key=environ.get("FD_API_KEY", "").split(",")[0].strip() or None,
        sync_update_timeout=s.sync_update_timeout,
        min_load_rate=s.min_load_rate,
        load_rate_window=s.load_rate_window,
        connections=ConnectionLimits(idle_timeout_s=s.idle_timeout, max_connections=s.max_connections),
        auth=AuthConfig(
            token_file=s.auth_token_file,
            tokenreview_audience=s.tokenreview_audience,
            allowed_usernames=tuple(s.allowed_usernames),
            relay_usernames=tuple(s.relay_allowed_usernames),
            disabled=s.no_auth,
        ),
        tls=TLSConfig(
            cert_file=s.tls_cert_file,
            key_file=s.tls_key_file,
            plain_http=s.plain_http,
            peer_ca_file=s.peer_ca_file,
        ),
        relay_token_file=s.relay_token_file,
        allowed_sources=tuple(s.allowed_sources),
        allow_link_local_sources=s.allow_link_local_sources,
        report=s.report,
        pod_name=environ.get("POD_NAME") or None,
        pod_namespace=environ.get("POD_NAMESPACE") or None,
    )


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
    from ckpt_agent.settings import SettingsError

    environ = dict(os.environ)
    try:
        settings = agent_settings(args, environ)
    except SettingsError as exc:
        print(f"ckpt-rollout agent: {exc}", file=sys.stderr)
        return 2
    announce = _setup_logging(settings.log_level, settings.log_format)
    config = config_from_settings(settings, args.host, environ)
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
        process_runtime.freeze_start_up()
        process_runtime.run(_agent_main(config, announce))
    except (ConfigError, EngineMisconfigured, BootCheckpointError) as exc:
        # A key file that cannot be read, an engine that cannot do what the agent needs, or
        # boot weights the engine cannot hold.
        print(f"ckpt-rollout agent: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_agent_parser(sub: SubParsers) -> None:
    from ckpt_agent.settings import add_setting_arguments

    p = sub.add_parser(
        "agent",
        help="run the worker agent (weight loads, FastDeploy-style control API)",
        description="Each setting comes from its flag if given, else from --config FILE, else its default.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON mapping of settings (keys: the flags' names with underscores, e.g. "
        "chunk_mb); a flag given on the command line overrides the file",
    )
    # Per pod: the bind address (the pod's own IP).
    p.add_argument("--host", default=None, help="bind address (default: $POD_IP, else 127.0.0.1)")
    add_setting_arguments(p)
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
        "--digest",
        choices=["blake3", "sha256"],
        default="blake3",
        help="cryptographic digest of every tensor and file, what bytes from a peer or over Mooncake "
        "are checked against (default blake3, manifest format 3; sha256 writes format 2, for agents "
        "older than format 3, at ~2.5x blake3's hashing cost)",
    )
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
