"""Adapter for a co-located FastDeploy server, through its V1 control API as FastDeploy's code
has it at upstream commit c1b7c083da606ed7f3ac35c2f905dc904f1163b2 (api_server.py routes,
engine/request.py ControlResponse, engine/common_engine.py `_control_*`, rl/dynamic_weight_manager.py):

    POST /v1/pause            aborts and drains in-flight requests, then pauses; re-entrant
    GET  /v1/is_paused        result {"is_paused": bool}
    POST /v1/update_weights   {"version", "verify_checksum"}: the engine pulls the version itself;
                              refused (500) unless paused; synchronous: answers once every
                              tensor-parallel rank has loaded, with one
                              {sync_cost, update_cost, total_cost, version, rank} per rank;
                              never resumes by itself
    POST /v1/resume           re-entrant

Every answer is the envelope {request_id, status: "success"|"error", error_message, result},
whose HTTP status is its code; refusals before the engine runs (400 for a wrong parameter type,
401 without the API key) are bare JSON. A success is HTTP 200 *and* status "success"; anything
else fails the load, quoting the status and FastDeploy's error_message. Only the HTTP status,
`status` and `result` decide: request_id and error_message are read when present, never
required (a reply without them is judged on its status alone).

Failure truth: each rank checks names, shapes and dtypes and then writes the new values into
the live parameters in place, so a failed update (or a rank that reports another version) may
leave a mix. Still paused, the adapter then loads the previous version back and reports it live
only once every rank reports it; otherwise the load fails with `weights_lost`: the pod turns
NotReady and FastDeploy stays paused (holder `weights-lost`) until a load succeeds. Otherwise the
agent always resumes what it paused. When a source is known the manifest is
fetched first, so an unknown version or a digest mismatch is refused before the engine pauses.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.engines.base import LoadJob, LoadOutcome
from ckpt_agent.engines.engine_http import EngineHttp, EngineNotConnected, completion, timed_generation
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.pipeline.pause_gate import PauseGate
from ckpt_agent.pipeline.reader import DEFAULT_CHUNK_BYTES, LoadProgress
from ckpt_agent.pipeline.sequence import Load, run_load
from ckpt_agent.pipeline.smoke import Verdict
from ckpt_api.agent_api import ControlStatus, HealthCheckRequest, LoadFailure, PauseState, RankResult
from ckpt_api.manifest import ManifestDocument, ReferenceRecord

log = logging.getLogger(__name__)


# FastDeploy's envelope as the agent reads it. Unlike the agent's own ControlReply (which always
# carries request_id and error_message), a reply is judged on its HTTP status and `status` only:
# one that lacks the bookkeeping fields must not turn a success into a failed load.
class _EngineReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    status: ControlStatus
    request_id: str | None = None
    error_message: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status is ControlStatus.SUCCESS


class _EnginePauseReply(_EngineReply):
    result: PauseState | None = None


class _EngineUpdateReply(_EngineReply):
    result: list[RankResult] | LoadFailure | None = None


# FastDeploy bounds update_weights itself: each rank must answer within 60 s
# (common_engine.py `_call_worker(control_request, 60)`, then 500 "... timed out after 60s"),
# and its API server waits at most 600 s for the engine (engine_client.py
# `asyncio.wait_for(..., timeout=600)`, then 500 "Timeout waiting for control method response").
# Waiting a little longer than 600 s means what we report is FastDeploy's own answer.
FASTDEPLOY_SERVER_WAIT_S = 600.0
DEFAULT_UPDATE_TIMEOUT_S = FASTDEPLOY_SERVER_WAIT_S + 30.0
# Pause answers only after the drain: uncapped at c1b7c08 (it force-reaps scheduler ghosts after
# 30 s), 60 s caps at e53f518; 120 s covers both.
DEFAULT_PAUSE_TIMEOUT_S = 120.0
DEFAULT_CONTROL_TIMEOUT_S = 30.0
# common_engine.py `_control_update_weights`: refused before anything is written.
PAUSE_REQUIRED = "Pause LLM Engine first before calling updating weights"


class _Refused(LoadError):
    """FastDeploy answered the call, and not with a success."""

    def __init__(self, message: str, status: int, said: str) -> None:
        super().__init__(Reason.ENGINE_ERROR, message)
        self.status = status
        self.said = said

    @property
    def changed_nothing(self) -> bool:
        """Refused before any rank ran: the API server's own 4xx (a parameter type, the API key,
        a route or method), or the engine's not-paused precondition."""
        return 400 <= self.status < 500 or self.said.endswith(PAUSE_REQUIRED)


def rank_shortfall(result: list[RankResult], expected: int) -> str | None:
    """What is wrong with the ranks a success reports, against ranks 0..expected-1: None when each
    reports exactly once; else which are missing, repeated or unknown. A result without a rank
    field counts as the rank of its position."""
    seen = [r.rank if r.rank is not None else i for i, r in enumerate(result)]
    missing = sorted(set(range(expected)) - set(seen))
    repeated = sorted({r for r in seen if seen.count(r) > 1})
    unknown = sorted({r for r in seen if not 0 <= r < expected})
    parts = [
        f"{what} {', '.join(map(str, ranks))}"
        for what, ranks in (("missing", missing), ("repeated", repeated), ("unknown", unknown))
        if ranks
    ]
    return "; ".join(parts) or None


class FastDeployEngine:
    name = "fastdeploy"
    supports_infer = False
    # The check generates through /v1/completions, which FastDeploy's pause holds back.
    checks_while_paused = False
    stages_only = False
    # FastDeploy reads the weights itself: no byte of a load passes the agent, whose floor on
    # bytes per second (service.load_watch) would fail every load; FastDeploy's own timeout
    # bounds it.
    pulls_weights_itself = True
    ranks: frozenset[int] | None = None  # FastDeploy reads the version itself
    # Its ranks hold a mix nobody can vouch for after a lost load: keep it paused until one succeeds.
    pauses_lost_weights = True
    relays_while_staging = False
    label = "FastDeploy"
    chunk_bytes = DEFAULT_CHUNK_BYTES  # never pulls: the sequence reads only the manifest
    parallelism = 1

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        control_timeout: float = DEFAULT_CONTROL_TIMEOUT_S,
        pause_timeout: float = DEFAULT_PAUSE_TIMEOUT_S,
        update_timeout: float = DEFAULT_UPDATE_TIMEOUT_S,
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
        resume_attempts: int = 3,
        ranks: int | None = None,
    ) -> None:
        self._api_key = api_key
        # FastDeploy answers with one result per rank that ran; a rank that never answered is
        # simply absent, so a count is the only way to see it (None: not checked).
        self._ranks = ranks
        self._control_timeout = control_timeout
        self._pause_timeout = pause_timeout
        self._update_timeout = update_timeout
        self.max_manifest_bytes = max_manifest_bytes
        self._resume_attempts = resume_attempts
        # FastDeploy's AuthenticationMiddleware (--api-key / FD_API_KEY) guards every /v1 path.
        self._http = EngineHttp(base_url, self.label, token=api_key)

    async def start(self) -> None:
        await self._http.start()

    async def close(self) -> None:
        await self._http.close()

    async def _call(
        self,
        method: str,
        path: str,
        model: type[_EnginePauseReply] | type[_EngineUpdateReply],
        body: dict[str, Any] | None = None,
        *,
        limit_s: float,
    ) -> Any:
        """The call's `result`; raises _Refused (FastDeploy said no), EngineNotConnected, or LoadError."""
        what = f"FastDeploy {method} {path}"
        status, text = await self._http.exchange(method, path, body, limit_s=limit_s)
        try:
            reply = model.model_validate_json(text)
        except ValidationError:
            # Not the envelope: a refusal before the engine ran ({"error": ...}) or a proxy's page.
            raise _Refused(f"{what}: HTTP {status}: {text[:500]}", status, text[:500]) from None
        said = reply.error_message or ""
        if status != 200 or not reply.succeeded:
            raise _Refused(f"{what}: HTTP {status}, status {reply.status}: {said[:500]}", status, said)
        return reply.result

    async def pause(self) -> None:
        try:
            await self._call("POST", "/v1/pause", _EnginePauseReply, limit_s=self._pause_timeout)
        except EngineNotConnected:
            raise
        except LoadError:
            # A pause we gave up on may still complete (FastDeploy runs control calls one at a
            # time): undo it. Resume is re-entrant there, so this is safe either way.
            with suppress(LoadError):
                await self._call("POST", "/v1/resume", _EnginePauseReply, limit_s=self._control_timeout)
            raise

    async def resume(self) -> None:
        # Resuming is what gives traffic back; retry briefly before declaring the engine stuck.
        for attempt in range(1, self._resume_attempts + 1):
            try:
                await self._call("POST", "/v1/resume", _EnginePauseReply, limit_s=self._control_timeout)
                return
            except LoadError:
                if attempt == self._resume_attempts:
                    raise
                log.warning("FastDeploy resume failed (attempt %d), retrying", attempt)
                await asyncio.sleep(0.2 * attempt)

    async def is_paused(self) -> bool:
        result = await self._call("GET", "/v1/is_paused", _EnginePauseReply, limit_s=self._control_timeout)
        if not isinstance(result, PauseState):
            raise LoadError(
                Reason.ENGINE_ERROR, f"FastDeploy GET /v1/is_paused: no result.is_paused: {result!r}"
            )
        return result.is_paused

    async def _update(self, version: str, verify_checksum: bool) -> list[RankResult]:
        """update_weights, and every rank must report `version`."""
        result = await self._call(
            "POST",
            "/v1/update_weights",
            _EngineUpdateReply,
            {"version": version, "verify_checksum": verify_checksum},
            limit_s=self._update_timeout,
        )
        if not isinstance(result, list) or not result:
            raise LoadError(
                Reason.ENGINE_ERROR, f"FastDeploy update_weights {version}: success without per-rank results"
            )
        wrong = [
            f"rank {r.rank if r.rank is not None else i}: {r.version!r}"
            for i, r in enumerate(result)
            if r.version != version
        ]
        if wrong:
            raise LoadError(
                Reason.ENGINE_ERROR,
                f"FastDeploy update_weights {version}: {len(wrong)} of {len(result)} ranks report another "
                f"version ({', '.join(wrong)})",
            )
        if self._ranks is not None:
            missing = rank_shortfall(result, self._ranks)
            if missing:
                raise LoadError(
                    Reason.ENGINE_ERROR,
                    f"FastDeploy update_weights {version}: {len(result)} rank results, expected ranks "
                    f"0..{self._ranks - 1}: {missing}",
                )
        return result

    async def _undo(self, job: LoadJob, failure: LoadError) -> LoadError:
        """After a failed update that may have written part of `job.version`: load the previous
        version back (still paused); the error to report, `weights_lost` unless every rank
        confirmed the previous version."""
        if isinstance(failure, EngineNotConnected) or (
            isinstance(failure, _Refused) and failure.changed_nothing
        ):
            return failure
        previous = job.previous
        if previous is None:
            return LoadError(
                failure.reason,
                f"{failure.message}; FastDeploy may hold part of {job.version}, and no previous version "
                "is known to load back (--initial-version names the engine's boot version)",
                weights_lost=True,
            )
        try:
            ranks = await self._update(previous.version, previous.checksum_verified)
        except LoadError as exc:
            return LoadError(
                failure.reason,
                f"{failure.message}; loading {previous.version} back failed too: {exc.message}",
                weights_lost=True,
            )
        log.warning(
            "FastDeploy: %s failed, %s loaded back on %d ranks", job.version, previous.version, len(ranks)
        )
        return LoadError(
            failure.reason, f"{failure.message}; {previous.version} loaded back on all {len(ranks)} ranks"
        )

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        return await run_load(self, job, gate, progress)

    # -- LoadSteps: FastDeploy reads the version itself; when a source is known the sequence
    # fetches the manifest first, so an unknown version or a digest mismatch is refused before
    # the engine pauses.
    async def prepare(self, job: LoadJob) -> None:
        if job.check_finite:
            # Refused, not skipped: a gate the user asked for must not pass by doing nothing.
            raise LoadError(
                Reason.ENGINE_ERROR,
                "checks.finite cannot run with the fastdeploy engine: FastDeploy pulls the weights "
                "itself and the agent never sees their bytes; unset spec.checks.finite for this fleet",
            )

    def check(self, manifest: ManifestDocument) -> None:
        pass

    def staging(self, load: Load) -> None:
        return None

    def staged(self, load: Load) -> None:
        pass

    async def apply_load(self, load: Load) -> None:
        await self._update(load.job.version, load.job.must_verify)

    async def restore(self, load: Load, failure: LoadError) -> LoadError:
        return await self._undo(load.job, failure)

    def landed(self, load: Load) -> None:
        return None

    def lost(self) -> None:
        pass

    async def infer(self) -> list[float]:
        raise NotImplementedError("FastDeploy serves its own OpenAI-compatible API")

    async def smoke(self, check: HealthCheckRequest, reference: ReferenceRecord | None) -> Verdict:
        """A greedy generation through FastDeploy's OpenAI-compatible /v1/completions (same
        server as the control routes; its CompletionRequest defaults `model`)."""
        return await timed_generation(completion(self._http, check))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self._http.base_url, "api_key": self._api_key is not None}
