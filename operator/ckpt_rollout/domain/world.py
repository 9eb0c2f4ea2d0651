"""What the reconcile machine reads besides the CR: pods, peers, settings, the clock, and its
in-memory observations of agents. Plain data, no I/O."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ckpt_api.source_policy import SourceRule
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WeightsReadyReason
from ckpt_rollout.domain.troubles import Trouble

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime(TIME_FORMAT)


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=UTC).timestamp()


def agent_url(ip: str, port: int, *, tls: bool) -> str:
    """https://ip:port (http:// without TLS), with an IPv6 pod IP in brackets (unbracketed, its
    colons read as a port). The pod IP is what is dialled; the certificate is checked for
    ckpt_api.tls.agent_server_name of the pod's namespace."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"{'https' if tls else 'http'}://{host}:{port}"


@dataclass(frozen=True)
class WeightsSignal:
    """The pod's WeightsReady condition as its agent last wrote it. Not an outcome (anyone who
    may patch pods/status could write it): a doorbell that says when asking the agent is worth it."""

    ready: bool
    reason: str
    message: str

    @property
    def loading(self) -> bool:
        return self.reason == WeightsReadyReason.LOADING


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str
    labels: Mapping[str, str]
    uid: str = ""  # "" where unknown (tests that build pods by hand)
    group_size: int | None = None  # its replica's pod count, as LeaderWorkerSet annotates it
    weights: WeightsSignal | None = None  # None: its agent never wrote the condition


@dataclass(frozen=True)
class Peer:
    """Another CheckpointRollout in the same namespace (for selector conflicts)."""

    name: str
    created: str
    selector: dict[str, Any]


@dataclass(frozen=True)
class Now:
    """The step's clock: wall time (second resolution, as status stores it) and a monotonic
    reading for the in-memory timers."""

    wall: float
    mono: float

    @property
    def stamp(self) -> str:
        return rfc3339(self.wall)


@dataclass(frozen=True)
class QueryAnswer:
    """What Prometheus answered to one instant query: its samples' values, or why it gave none."""

    values: tuple[float, ...] = ()
    error: str | None = None


@dataclass
class Tuning:
    poll_s: float = 0.5
    idle_poll_s: float = 2.0
    pull_after_s: float = 5.0
    pull_every_s: float = 3.0
    busy_retry_s: float = 1.0
    # Waves larger than this are pulled: their agents are asked not to write status.workers
    # (N agents merge-patching one CR serialize in the apiserver, with conflict retries: at a
    # few hundred concurrent reporters patches time out), and the operator pulls /v1/status
    # from pull_first_s after the call, then every half of the time waited (at most
    # pull_every_s, at least what keeps the wave under pull_rate pulls a second), writing each
    # step's outcomes in one patch.
    push_max_wave: int = 8
    pull_first_s: float = 0.25
    pull_rate: float = 500.0
    # A pulled member whose pod's WeightsReady condition says Loading is not pulled on the
    # schedule above: the condition's next change (the load ended) is its doorbell. Pulled at
    # least this often all the same, should that write be lost.
    pull_loading_s: float = 30.0
    # spec.strategy.analysis: where Prometheus is when the CR names none (--prometheus-url), and
    # the limit on one measurement's queries.
    prometheus_url: str | None = None
    # What a CR's prometheusAddress may name (--allowed-prometheus): the operator dials nothing
    # else with its network position. Empty: the one at prometheus_url only.
    prometheus_allowed: tuple[SourceRule, ...] = ()
    prometheus_timeout_s: float = 10.0
    # Agents serve https (the operator verifies them with --agent-ca-file): the peer URLs the
    # operator hands out say so too. False only with --agent-plain-http.
    agent_tls: bool = False


@dataclass
class Memory:
    """Per-CR observations of agents, kept between steps by the executor. Losing them (a
    restart) only makes the operator pull sooner: status holds everything that matters."""

    call_times: dict[str, float] = field(default_factory=dict)  # monotonic, first call
    last_pull: dict[str, float] = field(default_factory=dict)
    busy_until: dict[str, float] = field(default_factory=dict)  # call again from then on
    lost: set[str] = field(default_factory=set)  # the agent never got (or forgot) our call
    # Outcomes learned by the operator (pulled, or a rejected call) not yet in status.
    heard: dict[str, WorkerStatus] = field(default_factory=dict)
    # previousVersion probe of the canary: (pod, version it served or None) once answered.
    probed: tuple[str, str | None] | None = None
    announced: set[str] = field(default_factory=set)  # "pod/version" failures already evented
    # The last analysis measurement: (its Measurement.key, one answer per query), until folded.
    measured: tuple[str, tuple[QueryAnswer, ...]] | None = None
    # status.workers entries ignored (entry_trust), as "pod: why": each is logged once.
    ignored: set[str] = field(default_factory=set)
    # Why a pod's last call or pull made no progress (an answer such as 503 AuthUnavailable, no
    # connection), until one does.
    troubles: dict[str, Trouble] = field(default_factory=dict)
    # "pod/version" of the followers' confirms sent (ckpt_rollout.domain.gang), whatever answered.
    confirmed: set[str] = field(default_factory=set)
    # The pod's WeightsReady condition as it was when its agent was last called or pulled: a
    # change since is the agent's doorbell (Tuning.pull_loading_s).
    asked: dict[str, WeightsSignal | None] = field(default_factory=dict)
    # The last step left a pulled member to its doorbell: a WeightsReady change is worth a look.
    doorbell: bool = False

    def reset(self) -> None:
        self.call_times.clear()
        self.last_pull.clear()
        self.busy_until.clear()
        self.lost.clear()
        self.heard.clear()
        self.probed = None
        self.announced.clear()
        self.measured = None
        self.troubles.clear()
        self.confirmed.clear()
        self.asked.clear()
        self.doorbell = False
