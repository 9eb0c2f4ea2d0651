"""The worker agent's fleet-wide settings: one pydantic model, the one home of their defaults.

Every field is a setting that is the same on every worker of a fleet (engine, auth, TLS files,
limits...). `ckpt-rollout agent` reads them from three places; for each key the first that has it
wins:

1. a flag given on the command line (``--chunk-mb 8``: the key with dashes for underscores);
2. the file of ``--config FILE`` (YAML or JSON, a mapping of these keys: ``chunk_mb: 8``);
3. the default here.

``log_format`` alone also reads ``$CKPT_LOG_FORMAT``, between the flag and the file.
What differs per pod stays off this model: the bind address (``--host``, default ``$POD_IP``) and
the pod's identity from the downward API (``POD_NAME``, ``POD_NAMESPACE``). A key the model does
not know, or a value of the wrong type, is a `SettingsError` naming the key.

`python -m ckpt_agent.settings` prints the model's JSON schema (committed as
worker_image/agent-settings.schema.json; the chart's ``agentSettings`` value is checked against it).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from ckpt_agent.common.logformat import FORMATS
from ckpt_agent.engines.fastdeploy import DEFAULT_UPDATE_TIMEOUT_S
from ckpt_agent.engines.sglang import DEFAULT_PAUSE_MODE as SGLANG_DEFAULT_PAUSE_MODE
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.formats.synth import ReferenceModelSpec
from ckpt_agent.pipeline.reader import DEFAULT_CHUNK_BYTES
from ckpt_agent.server.control_api import DEFAULT_SYNC_TIMEOUT_S
from ckpt_agent.server.httpserver import ConnectionLimits
from ckpt_agent.service.load_watch import DEFAULT_LOAD_RATE_WINDOW_S, DEFAULT_MIN_LOAD_RATE
from ckpt_api.constants import DEFAULT_AGENT_METRICS_PORT, DEFAULT_AGENT_PORT

Engine = Literal["paddle", "fastdeploy", "null", "sglang", "vllm", "member"]
LogFormat = Literal["text", "json"]
assert get_args(LogFormat) == FORMATS  # the logging setup accepts exactly these

_MODEL = ReferenceModelSpec()
_CONNECTIONS = ConnectionLimits()


class SettingsError(ValueError):
    """A settings file that cannot be read, or a key or value the model refuses."""


class AgentSettings(BaseModel):
    """What `ckpt-rollout agent` runs with, the same on every worker of a fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="ckpt-rollout agent settings")

    port: int = Field(DEFAULT_AGENT_PORT, description="control API port")
    metrics_port: int = Field(
        DEFAULT_AGENT_METRICS_PORT,
        description="GET /metrics without credentials, for Prometheus (0: none; the control port's "
        "/metrics keeps asking for the operator's token)",
    )
    engine: Engine = Field(
        "paddle",
        description="the inference engine fed; null: loads apply instantly, nothing is pulled; member: "
        "a follower pod of a multi-node replica (stages each version where its node's ranks read it; "
        "the replica's leader agent drives the engine)",
    )
    source: str | None = Field(
        None, description="default checkpoint source: http(s)://host:port[/prefix] or file:///path"
    )
    initial_version: str | None = Field(
        None, description="version to load at startup (paddle) or that the engine serves"
    )
    initial_verify: bool = Field(True, description="verify the initial load")
    await_rollout: bool = Field(
        False,
        description="keep WeightsReady False until a CheckpointRollout confirms this pod's version "
        "(with the readiness gate: a new pod is not Ready before it serves the stable version)",
    )
    apply_mode: Literal["staged", "streamed"] = Field("staged", description="how a load reaches the engine")
    chunk_mb: int = Field(DEFAULT_CHUNK_BYTES >> 20, description="read size per transport call (MiB)")
    parallelism: int = Field(1, description="concurrent streams for staged loads")
    max_manifest_mb: int = Field(
        DEFAULT_MAX_MANIFEST_BYTES >> 20, description="largest manifest the agent reads (MiB)"
    )
    model_hidden: int = Field(_MODEL.hidden, description="paddle reference model width")
    model_layers: int = Field(_MODEL.layers, description="paddle reference model depth")
    model_outputs: int = Field(_MODEL.outputs, description="paddle reference model outputs")
    paddle_weights: Path | None = Field(
        None,
        description="boot the paddle engine with a model shaped like this checkpoint (a published "
        "version directory, a Hugging Face model directory or one .safetensors file) instead of the "
        "reference MLP; later versions must match its tensor names, dtypes and shapes; no /v1/infer",
    )
    relay: bool = Field(
        True,
        description="keep the verified copy of the live version (staged: its host staging arena) and "
        "serve it to peers under /v1/relay (peer relay)",
    )
    relay_mooncake: Literal["tcp", "rdma"] | None = Field(None, description="also relay over Mooncake")
    mooncake_device: str = Field("", description="RDMA devices for Mooncake (empty: discover)")
    fastdeploy_url: str = Field("http://127.0.0.1:8000", description="the FastDeploy server")
    engine_url: str | None = Field(
        None, description="sglang/vllm server (unset: http://127.0.0.1:30000 / :8000)"
    )
    staging_dir: Path | None = Field(
        None,
        description="where sglang/vllm/member versions are staged (tmpfs or NVMe path; the same path "
        "on every pod of a multi-node replica)",
    )
    ranks: str | None = Field(
        None,
        description="the tensor-parallel ranks this pod's engine runs (sglang/vllm/member), e.g. 0-7 or "
        "8,9: of a version saved per rank (sharded_state), only their files and the shared ones are "
        "pulled and staged (unset: every file)",
    )
    sglang_load_format: str | None = Field(
        None,
        description="load_format sent to SGLang's update_weights_from_disk (unset: the server's own; "
        "needed, e.g. auto, when SGLang runs --load-format dummy)",
    )
    sglang_pause_mode: Literal["abort", "retract", "in_place"] = Field(
        SGLANG_DEFAULT_PAUSE_MODE,
        description="how SGLang pauses for a load: abort in-flight requests (every response from one "
        "version), retract them (recomputed after the load), or in_place (keeps their KV cache; the "
        "radix cache is then not flushed)",
    )
    sglang_api_key_file: Path | None = Field(None, description="file holding the SGLang server's --api-key")
    vllm_api_key_file: Path | None = Field(
        None,
        description="file holding the vLLM server's --api-key (its /v1 routes, which the smoke check calls)",
    )
    sglang_admin_api_key_file: Path | None = Field(
        None,
        description="file holding the SGLang server's --admin-api-key (sent to its "
        "pause/update/continue routes)",
    )
    fastdeploy_update_timeout: float = Field(
        DEFAULT_UPDATE_TIMEOUT_S,
        description="seconds to wait for FastDeploy's update_weights (FastDeploy's API server gives up "
        "after 600 s and answers itself)",
    )
    fastdeploy_ranks: int | None = Field(
        None,
        ge=1,
        description="tensor-parallel ranks the FastDeploy server runs: a successful update_weights must "
        "report each of ranks 0..N-1 with the version, else the load fails and the previous version is "
        "loaded back (unset: every rank that answers must report the version, however many answer)",
    )
    fastdeploy_api_key_file: Path | None = Field(
        None, description="file holding FastDeploy's --api-key, sent as a bearer token (unset: $FD_API_KEY)"
    )
    sync_update_timeout: float = Field(
        DEFAULT_SYNC_TIMEOUT_S,
        description="seconds a synchronous update_weights (no rollout, no Prefer: respond-async) waits "
        "for its load (FastDeploy's own wait); the load goes on after",
    )
    min_load_rate: float = Field(
        float(DEFAULT_MIN_LOAD_RATE),
        description="bytes per second a load must average over load_rate_window, or it fails "
        "(SourceUnreachable; the previous weights serve, the engine resumes); a peer that slow is "
        "dropped for the source first. Per-read timeouts never catch a source that trickles (0: off)",
    )
    load_rate_window: float = Field(
        DEFAULT_LOAD_RATE_WINDOW_S,
        description="seconds over which min_load_rate is judged, and the grace a load gets before it "
        "is first judged",
    )
    idle_timeout: float = Field(
        _CONNECTIONS.idle_timeout_s,
        description="seconds a connection may stay open without a complete request head, from its "
        "opening or its last response (the header-read and keep-alive timeout)",
    )
    max_connections: int = Field(
        _CONNECTIONS.max_connections,
        description="open connections per port; past this a connection is answered 503 and closed",
    )
    auth_token_file: Path | None = Field(None, description="accept the bearer token stored in this file")
    tokenreview_audience: str | None = Field(
        None,
        description="check bearer tokens with TokenReview for this audience "
        "(ckpt-rollout-agent/<namespace>: peers present it) or, with POD_NAME set, for "
        "AUDIENCE/POD_NAME (what the operator mints for this agent alone); then authorize each "
        "caller by SubjectAccessReview in POD_NAMESPACE: `update` agents.rollout.ckpt.dev (named "
        "POD_NAME) for control calls, `get` for reads, `get` agents/relay for the relay",
    )
    allowed_usernames: list[str] = Field(
        default_factory=list,
        description="fallback to SubjectAccessReview: only these callers (flag: comma-separated, e.g. "
        "system:serviceaccount:ns:operator) may call, and may do everything",
    )
    no_auth: bool = Field(False, description="no authentication (local development only)")
    relay_allowed_usernames: list[str] = Field(
        default_factory=list,
        description="with allowed_usernames: peers that may read this agent's relay and nothing else "
        "(flag: comma-separated), e.g. system:serviceaccount:ns:ckpt-rollout-worker",
    )
    relay_token_file: Path | None = Field(
        None,
        description="this agent's own token for reading peers' relays (a projected token for the "
        "agents' audience; with auth_token_file, a relay-only secret the agents share, which this "
        "agent also accepts for its relay and nothing else); without it, and with auth on, peers "
        "are skipped for the source: the token a request carries is never sent on",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="serve the API port over HTTPS with this certificate (PEM, chain first; re-read "
        "when it changes: new connections get the rotated one)",
    )
    tls_key_file: Path | None = Field(None, description="the private key of tls_cert_file (PEM)")
    plain_http: bool = Field(
        False,
        description="serve the API port over plain HTTP (local development only; without it the "
        "agent needs tls_cert_file and tls_key_file)",
    )
    peer_ca_file: Path | None = Field(
        None,
        description="CA bundle that peers' certificates must chain to (verified for the name "
        "ckpt-rollout-agent.$POD_NAMESPACE.svc); an https peer failing it is skipped for the source",
    )
    allowed_sources: list[str] = Field(
        default_factory=list,
        description="rules scheme://host[:port][/path] a source must match (flag: comma-separated; "
        "host: a name, *.domain, * or a CIDR; file:///path for a directory tree); empty: any source",
    )
    allow_link_local_sources: bool = Field(
        False,
        description="let sources resolve to link-local addresses (169.254.0.0/16, fe80::/10: cloud metadata)",
    )
    report: bool | None = Field(
        None,
        description="write status.workers.<pod> and the WeightsReady condition (unset: when in a cluster)",
    )
    log_level: str = Field("info", description="logging level (debug, info, warning, error)")
    log_format: LogFormat = Field(
        "text",
        description="json: one object per line, the operator's fields (timestamp, severity, message); "
        "env CKPT_LOG_FORMAT",
    )


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _shown_default(info: FieldInfo) -> str:
    default = info.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list):
        return "[]"
    return json.dumps(default) if default == "" else str(default)


_GIVEN = "given_settings"  # the namespace attribute naming the settings given as flags


def _record(namespace: argparse.Namespace, dest: str) -> None:
    given = getattr(namespace, _GIVEN, None) or set()
    setattr(namespace, _GIVEN, given | {dest})


class _Store(argparse.Action):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values)
        _record(namespace, self.dest)


class _Switch(argparse.Action):
    """--name: true."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, True)
        _record(namespace, self.dest)


class _OnOff(argparse.BooleanOptionalAction):
    """--name / --no-name."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _record(namespace, self.dest)


def _argument(key: str, info: FieldInfo) -> dict[str, Any]:
    """argparse keywords for one setting. The namespace holds the model's default, as any
    argparse default; the flags actually given are recorded apart, so the file can sit between."""
    kind = _without_none(info.annotation)
    help_text = f"{info.description} (default: {_shown_default(info)})".replace("%", "%%")
    default = info.get_default(call_default_factory=True)
    kwargs: dict[str, Any] = {"default": default, "help": help_text, "dest": key, "action": _Store}
    if kind is bool:
        kwargs["action"] = _Switch if default is False else _OnOff
    elif get_origin(kind) is Literal:
        kwargs["choices"] = list(get_args(kind))
    elif get_origin(kind) is list:
        kwargs["type"] = _comma_list
    elif kind in (int, float):
        kwargs["type"] = kind
    return kwargs


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, its help and default from the model."""
    for key, info in AgentSettings.model_fields.items():
        parser.add_argument(flag_name(key), **_argument(key, info))


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags on this command line (not the defaults the namespace holds)."""
    given = getattr(args, _GIVEN, None) or set()
    return {key: getattr(args, key) for key in AgentSettings.model_fields if key in given}


def read_settings_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping of settings (an empty file: none)."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SettingsError(f"--config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"--config: {path} is not YAML or JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"--config: {path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def _problems(exc: ValidationError, flags: Mapping[str, Any], path: Path | None) -> Iterator[str]:
    for error in exc.errors():
        key = str(error["loc"][0]) if error["loc"] else "?"
        where = f"flag {flag_name(key)}" if key in flags else f"key {key!r} in {path}"
        if error["type"] == "extra_forbidden":
            yield f"{where}: unknown setting"
        else:
            yield f"{where}: {error['msg']} (got {error['input']!r})"


def load_settings(path: Path | None, flags: Mapping[str, Any], env: Mapping[str, str]) -> AgentSettings:
    """The settings of one agent: `flags` over the file at `path` over the defaults."""
    merged = read_settings_file(path) if path is not None else {}
    if "log_format" not in flags and env.get("CKPT_LOG_FORMAT"):
        merged["log_format"] = env["CKPT_LOG_FORMAT"]
    merged.update(flags)
    try:
        return AgentSettings.model_validate(merged)
    except ValidationError as exc:
        raise SettingsError("; ".join(_problems(exc, flags, path))) from None


def settings_schema() -> dict[str, Any]:
    return AgentSettings.model_json_schema()


def settings_reference_markdown() -> str:
    """The settings as a markdown table: key (in a --config file), flag, default, meaning."""
    rows = ["| Key | Flag | Default | Meaning |", "| --- | --- | --- | --- |"]
    for key, info in AgentSettings.model_fields.items():
        meaning = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{key}` | `{flag_name(key)}` | `{_shown_default(info)}` | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    json.dump(settings_schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
