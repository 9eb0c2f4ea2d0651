"""The API's identity, patterns and defaults, shared by the operator, the agent and the generated
CRD. Words written into objects (phases, reasons, annotations, ...) are in ckpt_api.vocabulary."""

GROUP = "rollout.ckpt.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CheckpointRollout"
PLURAL = "checkpointrollouts"
SINGULAR = "checkpointrollout"
SHORT_NAMES = ["ckr"]
CRD_NAME = f"{PLURAL}.{GROUP}"

DEFAULT_AGENT_PORT = 8089
# The agent's /metrics without credentials, for Prometheus (the control port needs the operator's).
DEFAULT_AGENT_METRICS_PORT = 8090
# Audience of the projected token the operator presents to agents: a token minted for the
# apiserver must not be replayable against the agents, and vice versa.
DEFAULT_AGENT_AUDIENCE = "ckpt-rollout-agent"


def agent_audience(namespace: str, base: str = DEFAULT_AGENT_AUDIENCE) -> str:
    """The audience of the agents of one worker namespace (an agent runs with
    `--tokenreview-audience=<base>/$(POD_NAMESPACE)`): a token captured in one namespace is
    refused by every other namespace's agents. Peers read each other's relay with it."""
    return f"{base}/{namespace}"


def agent_pod_audience(namespace_audience: str, pod: str) -> str:
    """The audience of the token the operator presents to one agent: its namespace's audience
    and its pod's name. An agent accepts its own and its namespace's, so what a pod receives
    from the operator (one that merely matches a selector, or anyone holding the namespace's
    agent certificate) opens no other agent."""
    return f"{namespace_audience}/{pod}"


# What an agent asks SubjectAccessReview about a caller (kube-rbac-proxy's model), in the agent's
# own namespace and named after its pod: `get` for reads, `update` for what changes state, and
# `get` on the subresource for peers reading its relay. No API serves this resource: RBAC rules
# may name any resource, and the chart's Roles grant it.
AGENT_RBAC_RESOURCE = "agents"
AGENT_RELAY_SUBRESOURCE = "relay"


# One char class, bounded length, and no path separators: the version is used as a directory
# name by sources and as a label-ish identifier in status.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
PERCENT_PATTERN = r"^(100|[1-9][0-9]?)%$"
PERCENT_OR_ZERO_PATTERN = r"^(100|[1-9]?[0-9])%$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
SOURCE_SCHEMES = ("mooncake", "http", "https", "file")
SOURCE_URI_PATTERN = r"^(mooncake|http|https|file)://[^\s]+$"
MAX_WAVES = 20
