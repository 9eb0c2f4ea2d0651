"""The agent's core: accepts update requests, runs one load at a time, keeps status, reports."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import prometheus_client

from ckpt_agent.common.errors import LoadError, Reason, RequestError
from ckpt_agent.common.metrics import PEER, SOURCE, AgentMetrics
from ckpt_agent.engines.base import Engine, LiveWeights, LoadJob, LoadOutcome
from ckpt_agent.pipeline.pause_gate import CHECK, LOAD, USER, WEIGHTS_LOST, PauseGate
from ckpt_agent.pipeline.reader import CANCELLED_MESSAGE, LoadProgress
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.relay_peer import PEER_TLS, PeerTLS, is_peer_fault
from ckpt_agent.pipeline.smoke import outcome_of, run_check
from ckpt_agent.service.load_run import LoadRun
from ckpt_agent.service.load_watch import (
    DEADLINE_GRACE_S,
    DEFAULT_LOAD_RATE_WINDOW_S,
    DEFAULT_MIN_LOAD_RATE,
    ThroughputFloor,
    describe_deadline,
)
from ckpt_agent.service.report import rfc3339
from ckpt_agent.service.reporting import StatusReporter
from ckpt_agent.transport import abort as load_abort
from ckpt_agent.transport.abort import LOAD_ABORT
from ckpt_agent.transport.guard import SOURCE_POLICY
from ckpt_api.agent_api import (
    AgentStatus,
    ErrorBody,
    HealthCheckResult,
    LastError,
    LastLoad,
    LoadCancelled,
    RelayState,
    RolloutRef,
    UpdateAccepted,
    UpdateCounts,
    UpdateWeightsRequest,
)
from ckpt_api.source_policy import SourcePolicy, SourceRefused
from ckpt_api.vocabulary import (
    AgentState,
    ErrorCode,
    LoadResult,
    UpdateResult,
    WeightsReadyReason,
    WorkerPhase,
)
from ckpt_api.worker_entries import worker_entry

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 30.0
# How long POST /v1/cancel_load waits for the load it stopped to end (the engine resumed, or the
# previous version restored), so that its answer can say the agent is free.
CANCEL_WAIT_SECONDS = 10.0
# The token a load presents to the peer it pulls from, given the request's own (None: no auth,
# none needed); raises NoRelayToken when this agent has none to present.
# This agent's own credential for peers' relays (None: it presents none). It is given nothing:
# the token a request carried is never this agent's to send on, whoever the peer is.
RelayCredential = Callable[[], str | None]


class NoRelayToken(Exception):
    """This agent cannot authenticate to peers: a load told of one reads the source instead."""


UPDATE_COUNTS = (*UpdateResult, *LoadResult)  # the `updates` counters of /v1/status


@dataclass(frozen=True)
class LoadEnd:
    """How a load ended, for a caller that waits for it (a synchronous update_weights)."""

    version: str
    error: LoadError | None  # None: `version` is live
    seconds: float
    paused_seconds: float  # the part of `seconds` the apply held the engine paused
    bytes: int
    checksum_verified: bool


@dataclass(frozen=True)
class Reply:
    status: int
    body: UpdateAccepted | ErrorBody
    # The load this request started (a 202), to wait for.
    load: asyncio.Task[LoadEnd] | None = None


class AgentService:
    def __init__(
        self,
        engine: Engine,
        *,
        default_source: str | None,
        reporter: StatusReporter,
        metrics: AgentMetrics,
        requires_source: bool,
        initial_version: str | None = None,
        initial_verify: bool = True,
        await_rollout: bool = False,
        source_policy: SourcePolicy | None = None,
        relay_credential: RelayCredential = lambda: None,
        peer_tls: PeerTLS | None = None,
        min_load_rate: float = DEFAULT_MIN_LOAD_RATE,
        load_rate_window_s: float = DEFAULT_LOAD_RATE_WINDOW_S,
    ) -> None:
        self.engine = engine
        self._min_load_rate = min_load_rate
        self._load_rate_window_s = load_rate_window_s
        self.peer_tls = peer_tls or PeerTLS()
        self.source_policy = source_policy or SourcePolicy()
        self._relay_credential = relay_credential
        self.gate = PauseGate(engine)
        self.reporter = reporter
        self.metrics = metrics
        self._default_source = default_source
        self._requires_source = requires_source
        self._initial = (initial_version, initial_verify)
        self._confirmed = not await_rollout  # a rollout has confirmed the live version
        # The live version was staged for a replica's leader (a staging call) and no call has
        # confirmed it since: the pod stays NotReady while its replica switches.
        self._staged = False
        self.live: LiveWeights | None = None
        self.weights_lost = False
        self.state = AgentState.IDLE
        self.target: str | None = None
        self.progress = LoadProgress()
        self.last_error: LastError | None = None
        self.last_load: LastLoad | None = None
        self.updates: Counter[str] = Counter()
        self._task: asyncio.Task[LoadEnd] | None = None
        self._current: LoadRun | None = None  # the load running (or the last one)
        # The copy of the live version that peers may pull (see ckpt_agent.pipeline).
        self.relay: RelayCopy | None = None
        # The engine is held paused (WEIGHTS_LOST) because weights that failed their smoke check
        # could not be replaced: lifted by the next load that succeeds.
        self._holds_failed_weights = False

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.engine.start()
        version, verify = self._initial
        if version is not None and self._default_source is None and self._requires_source:
            raise ValueError("--initial-version needs --source to load from")
        if version is not None and self._requires_source:
            self._begin(UpdateWeightsRequest(version=version, verify_checksum=verify))
        else:
            # An engine that loaded its own weights at boot (FastDeploy) serves them already.
            if version is not None:
                self.live = LiveWeights(version, self._default_source, None, False)
                self.metrics.set_live_version(version)
            self._ready(f"serving {version or 'the engine boot weights'}")

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._stop(LoadError(Reason.CANCELLED, CANCELLED_MESSAGE))
            try:
                await asyncio.wait_for(asyncio.shield(self._task), SHUTDOWN_GRACE_SECONDS)
            except TimeoutError:
                log.warning("load of %s still running at shutdown", self.target)
        self._withdraw_relay()
        await self.engine.close()
        await self.reporter.close()

    # -- requests ------------------------------------------------------------------------------
    @property
    def loading(self) -> bool:
        return self._task is not None and not self._task.done()

    def request_update(self, req: UpdateWeightsRequest) -> Reply:
        if req.stage and not self.engine.stages_only:
            self._count(UpdateResult.REJECTED)
            raise RequestError(
                f"stage is for a multi-node replica's followers (engine member), "
                f"not engine {self.engine.name}",
                field="stage",
            )
        if self.loading:
            self._count(UpdateResult.CONFLICT)
            return Reply(
                409,
                ErrorBody(
                    error=ErrorCode.LOAD_IN_PROGRESS,
                    message=f"a load of {self.target} is running; retry when it finishes",
                    target=self.target,
                ),
            )
        if self._already_live(req):
            self._count(UpdateResult.NOOP)
            if self.state == AgentState.FAILED:
                self.state = AgentState.IDLE
            if req.rollout is not None:
                reason, said = (Reason.STAGED, "staged") if req.stage else (Reason.LOADED, "live")
                self._report(
                    req.rollout, req.version, WorkerPhase.UPDATED, reason, f"{req.version} is {said}", 0, 0.0
                )
                # A staging call means the replica is about to switch, even to what is staged here.
                if req.stage or not self._confirmed or self._staged:
                    self._confirmed, self._staged = True, bool(req.stage)
                    self._ready(f"serving {req.version}")
            return Reply(200, UpdateAccepted(accepted=True, noop=True, version=req.version))
        if self._requires_source and req.source is None and self._default_source is None:
            self._count(UpdateResult.REJECTED)
            raise RequestError(
                "the request has no source and the agent was started without --source", field="source"
            )
        uri = req.source.uri if req.source else self._default_source
        try:
            if uri is not None:
                self.source_policy.check_uri(uri)
        except SourceRefused as exc:
            refused = RequestError(str(exc), field="source.uri", reason=ErrorCode.INVALID_SOURCE, status=403)
            self.reject(refused, req.version, req.rollout)
            raise refused from None
        self._count(UpdateResult.ACCEPTED)
        task = self._begin(req)
        return Reply(202, UpdateAccepted(accepted=True, version=req.version), task)

    def _already_live(self, req: UpdateWeightsRequest) -> bool:
        """Same version, and nothing the request asks for is missing: a request that pins another
        manifest digest, or asks for verification the live load skipped, gets a real load."""
        live = self.live
        if live is None or self.weights_lost or live.version != req.version:
            return False
        pin = req.source.manifest_digest if req.source else None
        if pin is not None and live.manifest_digest is not None and pin != live.manifest_digest:
            return False
        # A pin implies verification (LoadJob.must_verify), so it too needs a verified live load.
        wants_verified = req.verify_checksum or pin is not None
        return not (wants_verified and not live.checksum_verified and self._requires_source)

    def reject(self, error: RequestError, version: object, rollout: RolloutRef | None) -> None:
        """Book a refused request; an invalid version is also a failed update worth reporting."""
        self._count(UpdateResult.REJECTED)
        if error.reason in (Reason.INVALID_VERSION, Reason.INVALID_SOURCE):
            shown = str(version)[:256]
            self.last_error = LastError(version=shown, reason=error.reason, message=error.message)
            if rollout is not None:
                self._report(rollout, shown, WorkerPhase.FAILED, error.reason, error.message, 0, 0.0)

    def _count(self, result: str) -> None:
        self.updates[result] += 1
        self.metrics.update_requests.labels(result).inc()

    async def pause(self) -> None:
        await self.gate.acquire(USER)

    async def resume(self) -> None:
        await self.gate.release(USER)

    async def cancel_load(self, version: str | None) -> tuple[int, LoadCancelled | ErrorBody]:
        """Stop the running load (only if it loads `version`, when given: a caller must never
        stop a newer load it did not mean); answers once it ended, or after CANCEL_WAIT_SECONDS."""
        task, target = self._task, self.target
        if task is None or task.done() or target is None:
            return 404, ErrorBody(error=ErrorCode.NOT_FOUND, message="no load is running; nothing cancelled")
        if version is not None and version != target:
            return 409, ErrorBody(
                error=ErrorCode.LOAD_IN_PROGRESS,
                message=f"the load running is of {target}, not {version}; nothing cancelled",
                target=target,
            )
        log.warning("cancelling the load of %s (POST /v1/cancel_load)", target)
        if self._current is not None:
            self._current.caller_stopped = True
        self._stop(LoadError(Reason.CANCELLED, f"load of {target} cancelled (POST /v1/cancel_load)"))
        done, _ = await asyncio.wait({task}, timeout=CANCEL_WAIT_SECONDS)
        live = self.live.version if self.live else None
        return 200, LoadCancelled(version=target, ended=bool(done), live_version=live)

    def _stop(self, error: LoadError) -> None:
        """Stop the running load with `error`: its reads are woken, its loops stop at their next
        cancel check, and (unless it already changed the weights past undoing) the previous
        weights serve again, the engine resumed."""
        if self._current is not None:
            self._current.stop(error)

    # -- loads ---------------------------------------------------------------------------------
    def _withdraw_relay(self) -> None:
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.release()

    def _publish_relay(self, copy: RelayCopy) -> None:
        """A load relayed while it runs: its copy is served from now on (tensor by tensor). The
        live version's copy is set aside, not released: it comes back if this load fails
        before it changes the weights (see _run)."""
        if self._current is None or self.relay is not self._current.standing:
            self._withdraw_relay()
        self.relay = copy

    def _retire_standing(self) -> None:
        """The load is about to change the weights: the copy of the version they held no longer
        describes what is live (and its staging memory may be needed)."""
        run = self._current
        if run is None:
            return
        standing, run.standing = run.standing, None
        if standing is not None:
            if self.relay is standing:
                self.relay = None
            standing.release()

    def _reinstate_standing(self, run: LoadRun) -> None:
        """A failed load that never changed the weights (refused, or failed while pulling or
        verifying): the version still live is relayed again, so the next wave's peers still
        find it here."""
        standing = run.standing
        if standing is None or standing.released or self.weights_lost:
            return
        if self.relay is not None and self.relay is not standing:
            self._withdraw_relay()  # the failed load's own copy
        self.relay = standing

    def _peer_credential(self, peer: str) -> str | None:
        """What to present to ``peer``; raises NoRelayToken (or SourceRefused) when the peer is
        to be skipped. A peer is dialled like a source: the source policy judges it first."""
        self.source_policy.check_uri(peer)
        return self._relay_credential()

    def _begin(self, req: UpdateWeightsRequest) -> asyncio.Task[LoadEnd]:
        source = req.source
        peer = source.peer if source else None
        credential: str | None = None
        skipped: str | None = None
        try:
            credential = self._peer_credential(peer) if peer else None
        except (NoRelayToken, SourceRefused) as exc:
            skipped = f"peer {peer} skipped: {exc}"
            log.warning("%s; loading %s from the source", skipped, req.version)
            peer = None
        job = LoadJob(
            version=req.version,
            verify_checksum=req.verify_checksum,
            source_uri=source.uri if source else self._default_source,
            manifest_digest=source.manifest_digest if source else None,
            previous=None if self.weights_lost else self.live,
            peer=peer,
            bearer=credential if peer else None,
            check_finite=req.checks is not None and req.checks.finite,
            health_check=req.health_check,
            relay_while_loading=bool(source is not None and source.relay_while_loading),
            publish_relay=self._publish_relay,
            retain=tuple(req.retain or ()),
        )
        # The live version's copy is still served while this load pulls and verifies; it is
        # released once the load takes the engine to change the weights (or succeeds).
        self._current = run = LoadRun(job, standing=self.relay, peer_skipped=skipped, stage=bool(req.stage))
        self.gate.before_acquire(LOAD, self._retire_standing)
        self.state = AgentState.LOADING
        self.target = req.version
        self.progress = LoadProgress()
        self._task = asyncio.create_task(
            self._run(run, req.rollout, req.deadline_seconds), name=f"load-{req.version}"
        )
        return self._task

    async def _run(
        self, run: LoadRun, rollout: RolloutRef | None, deadline_s: float | None = None
    ) -> LoadEnd:
        job = run.job
        started = time.monotonic()
        SOURCE_POLICY.set(self.source_policy)  # this load's task and the threads it starts
        PEER_TLS.set(self.peer_tls)
        LOAD_ABORT.set(run.abort)
        watch = asyncio.create_task(self._watch(run, deadline_s), name=f"watch-{job.version}")
        self.gate.held_seconds.pop(LOAD, None)
        self.metrics.load_in_progress.set(1)
        self.reporter.weights_ready(False, WeightsReadyReason.LOADING, f"loading {job.version}")
        if rollout is not None:
            self._report(
                rollout, job.version, WorkerPhase.LOADING, Reason.LOADING, f"loading {job.version}", 0, 0.0
            )
        try:
            async with self._traffic_held_until_checked(job):
                outcome = await self._load(run, rollout.name if rollout else None)
                await self._smoke(run, outcome)
        except Exception as exc:
            error = run.why_stopped(
                exc if isinstance(exc, LoadError) else LoadError(Reason.ENGINE_ERROR, f"load failed: {exc!r}")
            )
            if not isinstance(exc, LoadError):
                log.exception("load of %s failed unexpectedly", job.version)
            if self.relay is not None and not self.relay.complete:
                self._withdraw_relay()  # a copy of the failed load, published while it ran
            seconds = time.monotonic() - started
            self._failed(run, error, rollout, seconds)
            self._reinstate_standing(run)
            return self._end(job, error, seconds, self.progress.bytes_done, False)
        else:
            seconds = time.monotonic() - started
            self.live = LiveWeights(
                job.version, job.source_uri, outcome.manifest_digest, outcome.checksum_verified
            )
            self.weights_lost = False
            self.state = AgentState.IDLE
            self.metrics.set_live_version(job.version)
            self.metrics.loads.labels(LoadResult.SUCCEEDED, Reason.LOADED).inc()
            self.metrics.load_bytes.observe(outcome.bytes)
            self.metrics.load_seconds.labels(LoadResult.SUCCEEDED).observe(seconds)
            self.updates[LoadResult.SUCCEEDED] += 1
            self._record(
                run, WorkerPhase.UPDATED, Reason.LOADED, seconds, outcome, verified=outcome.checksum_verified
            )
            # Relayed even when this load skipped verification: receivers always verify peer
            # bytes against the source's manifest.
            self.relay = outcome.relay
            message = f"{job.version} is live ({outcome.bytes} bytes in {seconds:.2f}s)"
            last = self.last_load
            if last is not None and last.fallback_reason is not None:
                # In the CR too: a peer dropped part way (or never used) is worth seeing there.
                message += (
                    f"; {last.bytes_from_source} bytes from the source after peer {job.peer or last.peer}: "
                    f"{last.fallback_reason}"
                )
            if run.check is not None:
                message += f"; {run.check.verdict.message}"
            log.info("%s", message)
            self._staged = run.stage
            if rollout is not None:
                reason = Reason.STAGED if run.stage else Reason.LOADED
                self._report(
                    rollout, job.version, WorkerPhase.UPDATED, reason, message, outcome.bytes, seconds
                )
                self._confirmed = True
            self._ready(f"serving {job.version}")
            return self._end(job, None, seconds, outcome.bytes, outcome.checksum_verified)
        finally:
            watch.cancel()
            self.gate.before_acquire(LOAD, None)
            if run.standing is not self.relay:
                self._retire_standing()  # replaced by this load's copy, or not to be trusted
            run.standing = None
            self.target = None
            self.metrics.load_in_progress.set(0)

    async def _watch(self, run: LoadRun, deadline_s: float | None) -> None:
        """Stop the load once it passes its deadline, or moves bytes slower than the floor
        (service.load_watch): a slow peer is dropped first (the load goes on from the source),
        a slow source stops the load."""
        if getattr(self.engine, "pulls_weights_itself", False):
            return  # the agent moves no bytes: the engine's own timeout bounds its load
        job = run.job
        started = time.monotonic()
        rule = ThroughputFloor(self._min_load_rate, self._load_rate_window_s)
        progress, peer_dropped = self.progress, False
        rule.restart(started, progress.bytes_done)
        tick = min(1.0, self._load_rate_window_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if self.progress is not progress:  # a new attempt (the source after the peer): from zero
                progress = self.progress
                rule.restart(now, progress.bytes_done)
            if progress.bytes_total and progress.bytes_done >= progress.bytes_total:
                # Every byte is in: applying them (or loading the previous version back after a
                # failed smoke check) is local work, never to be cut short.
                continue
            # The grace: the caller's own timer set to the same figure (the operator sends its
            # worker timeout) decides first, with its reason; the agent then frees itself.
            if deadline_s is not None and now - started > deadline_s + DEADLINE_GRACE_S:
                run.stop(LoadError(Reason.SOURCE_UNREACHABLE, describe_deadline(job.version, deadline_s)))
                return
            slow = rule.too_slow(now, progress.bytes_done)
            if slow is None:
                continue
            if run.on_peer and progress.fallback_reason is None and not peer_dropped:
                log.warning("peer %s too slow loading %s (%s): dropping it", job.peer, job.version, slow)
                run.abort.abort(LoadError(Reason.SOURCE_UNREACHABLE, f"too slow: {slow}"), load_abort.PEER)
                peer_dropped = True
                rule.restart(now, progress.bytes_done)
                continue
            run.stop(LoadError(Reason.SOURCE_UNREACHABLE, f"the load of {job.version} is too slow: {slow}"))
            return

    @asynccontextmanager
    async def _traffic_held_until_checked(self, job: LoadJob) -> AsyncIterator[None]:
        """Around a load and its smoke check: on an engine that can be probed paused, the pause
        of the apply is handed to CHECK and held until the verdict, and on a failed check until
        the previous version is back, so no request (the pod's readiness aside: a client may call
        the pod directly) is answered from weights that have not passed. Weights that failed and
        could not be replaced stay paused (WEIGHTS_LOST) until a load succeeds."""
        hold = job.health_check is not None and self.engine.checks_while_paused
        if hold:
            self.gate.hand_over(LOAD, CHECK)
        try:
            yield
        except LoadError as exc:
            if hold and exc.weights_lost and exc.reason == Reason.HEALTH_CHECK_FAILED:
                self.gate.hand_over(CHECK, WEIGHTS_LOST)
                if CHECK in self.gate.holders:
                    self._holds_failed_weights = True
            raise
        else:
            if self._holds_failed_weights:
                self._holds_failed_weights = False
                await self.gate.release(WEIGHTS_LOST)
        finally:
            self.gate.hand_over(LOAD, None)
            # Shielded: a cancelled load must still resume the engine it held.
            await asyncio.shield(self.gate.release(CHECK))
            self.gate.hand_over(CHECK, None)

    async def _smoke(self, run: LoadRun, outcome: LoadOutcome) -> None:
        """The request's smoke check of the weights just applied (pod not Ready yet; the engine
        still paused where it can be probed so: _traffic_held_until_checked). On failure the
        previous version is loaded back, and LoadError(HealthCheckFailed) raised: with
        `weights_lost` when there was none, or loading it back failed too."""
        job = run.job
        if job.health_check is None:
            return
        probe = self.engine.smoke(job.health_check, outcome.reference)
        run.check = check = await run_check(probe, job.health_check.timeout_seconds)
        self.metrics.health_checks.labels(outcome_of(check.verdict)).inc()
        if check.verdict.passed is not False:
            return
        log.warning("%s failed its %s; loading the previous version back", job.version, check.verdict.message)
        if outcome.relay is not None:
            outcome.relay.release()  # never relay the bytes that failed
        raise await self._load_back(job, check.verdict.message)

    async def _load_back(self, job: LoadJob, failure: str) -> LoadError:
        """Load `job.previous` again, as any load (digest-pinned when its digest is known)."""
        previous = job.previous
        if previous is None:
            return LoadError(
                Reason.HEALTH_CHECK_FAILED,
                f"{failure}; no earlier version is known to load back, so the engine holds "
                f"{job.version}'s weights and the pod stays NotReady",
                weights_lost=True,
            )
        restore = LoadJob(
            version=previous.version,
            verify_checksum=previous.checksum_verified,
            source_uri=previous.source_uri,
            manifest_digest=previous.manifest_digest,
            previous=None,
            cancel=job.cancel,  # a shutdown stops it as it stops the load
        )
        try:
            restored = await self.engine.load(restore, self.gate, LoadProgress())
        except Exception as exc:
            # Whatever went wrong, the engine may hold the failed version: nothing to vouch for.
            why = exc.message if isinstance(exc, LoadError) else repr(exc)
            return LoadError(
                Reason.HEALTH_CHECK_FAILED,
                f"{failure}; loading {previous.version} back failed too: {why}",
                weights_lost=True,
            )
        self.relay = restored.relay
        return LoadError(Reason.HEALTH_CHECK_FAILED, f"{failure}; {previous.version} loaded back")

    def _end(
        self, job: LoadJob, error: LoadError | None, seconds: float, nbytes: int, verified: bool
    ) -> LoadEnd:
        paused = self.gate.held_seconds.get(LOAD, 0.0)
        return LoadEnd(job.version, error, seconds, min(paused, seconds), nbytes, verified)

    async def _load(self, run: LoadRun, rollout: str | None) -> LoadOutcome:
        """The engine's load; if the peer failed or sent bad bytes, the whole load again from
        the original source."""
        job = run.job
        run.fallback, run.peer_bytes = run.peer_skipped, 0
        try:
            return await self._attempt(run, job, rollout)
        except LoadError as exc:
            if job.peer is None or exc.weights_lost or not is_peer_fault(exc):
                raise
            if self.progress.fallback_reason is not None:
                raise  # it left the peer part way already: this failure is the source's
            run.fallback = f"{exc.reason}: {exc.message}"
        run.peer_bytes = self.progress.bytes_done
        log.warning("peer load of %s failed (%s); falling back to the source", job.version, run.fallback)
        return await self._attempt(run, replace(job, peer=None, bearer=None), rollout)

    async def _attempt(self, run: LoadRun, job: LoadJob, rollout: str | None) -> LoadOutcome:
        # Each attempt from zero, counted by origin: a failing peer's bytes cost bandwidth too.
        source = self.metrics.pulled(rollout, SOURCE)
        run.on_peer = job.peer is not None
        self.progress = _CountedProgress(
            counter=self.metrics.pulled(rollout, PEER) if job.peer else source, after_fallback=source
        )
        return await self.engine.load(job, self.gate, self.progress)

    def _ready(self, message: str) -> None:
        if self._staged:
            self.reporter.weights_ready(
                False, WeightsReadyReason.STAGED, f"{message}: staged, its replica has not switched to it yet"
            )
        elif self._confirmed:
            self.reporter.weights_ready(True, WeightsReadyReason.LOADED, message)
        else:
            self.reporter.weights_ready(
                False, WeightsReadyReason.AWAITING_ROLLOUT, f"{message}; no rollout has confirmed it yet"
            )

    def _failed(self, run: LoadRun, error: LoadError, rollout: RolloutRef | None, seconds: float) -> None:
        job = run.job
        log.warning("load of %s failed: %s: %s", job.version, error.reason, error.message)
        if error.weights_lost:
            self.live = None
            self.weights_lost = True
            self.metrics.set_live_version(None)
        self.state = AgentState.FAILED
        self.last_error = LastError(version=job.version, reason=error.reason, message=error.message)
        self.metrics.loads.labels(LoadResult.FAILED, error.reason).inc()
        self.metrics.load_seconds.labels(LoadResult.FAILED).observe(seconds)
        self.updates[LoadResult.FAILED] += 1
        done = self.progress.bytes_done
        self._record(run, WorkerPhase.FAILED, error.reason, seconds, None, nbytes=done, message=error.message)
        if rollout is not None and not run.caller_stopped:
            self._report(rollout, job.version, WorkerPhase.FAILED, error.reason, error.message, done, seconds)
        if self.weights_lost:
            # Lost by this load or an earlier one: a failure that never reached the engine (an
            # unknown version, a bad manifest) does not make it whole again.
            self.reporter.weights_ready(False, WeightsReadyReason.WEIGHTS_LOST, error.message)
        else:
            live = self.live.version if self.live else "the engine boot weights"
            self._ready(f"serving {live}; loading {job.version} failed")

    def _record(
        self,
        run: LoadRun,
        phase: WorkerPhase,
        reason: str,
        seconds: float,
        outcome: LoadOutcome | None,
        *,
        nbytes: int | None = None,
        verified: bool = False,
        message: str = "",
    ) -> None:
        """The last load for /v1/status, with where its bytes came from: the peer, the source, or
        both (a fallback after the peer failed part way). `outcome`: of the attempt that
        succeeded, if any."""
        job = run.job
        loaded = outcome.bytes if outcome is not None else 0
        from_peer = outcome is not None and outcome.from_peer
        peer_bytes, source_bytes = (loaded, 0) if from_peer else (run.peer_bytes, loaded)
        fallback = run.fallback
        left_at = self.progress.bytes_before_fallback
        if job.peer is not None and left_at is not None and (outcome is None or from_peer):
            # The peer failed part way and the source sent the rest (resumed by tensor), or
            # failed the load in its turn.
            peer_bytes, source_bytes = left_at, max(self.progress.bytes_done - left_at, 0)
            fallback = self.progress.fallback_reason
        self.last_load = LastLoad(
            version=job.version,
            phase=phase,
            reason=reason,
            message=message,
            bytes=loaded if nbytes is None else nbytes,
            seconds=round(seconds, 3),
            checksum_verified=verified,
            finished_at=rfc3339(),
            peer=job.peer,
            bytes_from_peer=peer_bytes,
            bytes_from_source=source_bytes,
            fallback_reason=fallback,
            health_check=None
            if run.check is None
            else HealthCheckResult(
                passed=run.check.verdict.passed,
                message=run.check.verdict.message,
                seconds=round(run.check.seconds, 3),
            ),
        )

    def _report(
        self,
        rollout: RolloutRef,
        version: str,
        phase: WorkerPhase,
        reason: str,
        message: str,
        nbytes: int,
        seconds: float,
    ) -> None:
        verified = phase == WorkerPhase.UPDATED and self.live is not None and self.live.checksum_verified
        entry = worker_entry(
            version=version,
            phase=phase,
            reason=reason,
            message=message,
            checksum_verified=verified,
            bytes=nbytes,
            seconds=seconds,
            last_transition_time=rfc3339(),
            live_version=self.live.version if self.live else None,
            wave=rollout.wave,
            uid=rollout.uid,
            manifest_digest=self.live.manifest_digest if phase == WorkerPhase.UPDATED and self.live else None,
            bytes_from_peers=self._peer_bytes_of(version) if phase == WorkerPhase.UPDATED else None,
        )
        self.reporter.worker_event(rollout, entry)

    def _peer_bytes_of(self, version: str) -> int | None:
        last = self.last_load
        return last.bytes_from_peer if last is not None and last.version == version else None

    # -- status --------------------------------------------------------------------------------
    def status(self) -> AgentStatus:
        live = self.live
        return AgentStatus(
            version=live.version if live else None,
            state=self.state,
            target=self.target,
            bytes_done=self.progress.bytes_done,
            bytes_total=self.progress.bytes_total,
            last_error=self.last_error,
            checksum_verified=bool(live and live.checksum_verified),
            manifest_digest=live.manifest_digest if live else None,
            source=live.source_uri if live else None,
            weights_lost=self.weights_lost,
            staged=self._staged,
            updates=UpdateCounts.model_validate({k: self.updates[k] for k in UPDATE_COUNTS}),
            last_load=self.last_load,
            relay=None
            if self.relay is None
            else RelayState(
                version=self.relay.version, from_=self.relay.source, complete=self.relay.complete
            ),
            paused_by=self.gate.holders,
            engine=self.engine.describe(),
            report=self.reporter.describe(),
        )


@dataclass
class _CountedProgress(LoadProgress):
    """Progress that also counts the bytes as they arrive, so the pulled-bytes rate shows the
    throughput during a long load, not a spike at its end."""

    counter: prometheus_client.Counter = field(kw_only=True)
    # Where bytes count once the load left its peer for the source part way.
    after_fallback: prometheus_client.Counter | None = field(default=None, kw_only=True)

    def add(self, n: int) -> None:
        super().add(n)
        self.counter.inc(n)

    def fall_back(self, reason: str) -> None:
        super().fall_back(reason)
        if self.after_fallback is not None:
            self.counter = self.after_fallback
