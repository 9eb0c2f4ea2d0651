"""HTTP calls from the operator to worker agents (FastDeploy-style control API), built and read
with the agent's own wire models (ckpt_api.agent_api)."""

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ckpt_api.agent_api import AgentStatus, CancelLoadRequest, ErrorBody, UpdateWeightsRequest
from ckpt_api.tls import ReloadingContext, agent_server_name
from ckpt_rollout.domain.troubles import NoAnswer, Trouble, answer_trouble
from ckpt_rollout.io.agent_http import AgentHttp, AnswerLost, CertificateFailed, ConnectFailed, Endpoint
from ckpt_rollout.io.agent_tokens import AgentTokens, AgentTokenUnavailable
from ckpt_rollout.io.http_wire import Answer


@dataclass(frozen=True)
class CallResult:
    """Outcome of one HTTP call. ``status`` 0 means the agent could not be reached."""

    status: int
    # The answer's JSON object (`status()`: empty once read into ``agent_status``).
    body: dict[str, Any]
    error: str = ""
    # False when no connection could be made: the request surely never reached the agent
    # (nothing listens yet, e.g. a new pod whose agent is still starting).
    connected: bool = True
    # `status()` only: the parsed body of a 200.
    agent_status: AgentStatus | None = None
    # With ``status`` 0: why there was no answer, where it is not plain (a refused connection).
    why_none: NoAnswer | None = None

    @property
    def accepted(self) -> bool:
        return self.status in (200, 202)

    @property
    def busy(self) -> bool:
        return self.status == 409

    @property
    def no_answer(self) -> NoAnswer | None:
        if self.status != 0:
            return None
        if self.why_none is not None:
            return self.why_none
        return NoAnswer.BROKEN if self.connected else NoAnswer.UNREACHABLE

    def trouble(self) -> Trouble | None:
        """What the answer says is in the way (ckpt_rollout.domain.troubles), or None."""
        error = self.error_body()
        if error is not None:
            return answer_trouble(self.status, error.error, error.message, None)
        return answer_trouble(self.status, None, self.error, self.no_answer)

    def error_body(self) -> ErrorBody | None:
        """The agent's error body, if the answer is one (a proxy's or a non-agent's is not)."""
        if self.status < 400 or "error" not in self.body:
            return None  # not one: spares a refused validation on every accepted call
        try:
            return ErrorBody.model_validate(self.body)
        except ValidationError:
            return None


class AgentClient:
    def __init__(
        self,
        tokens: AgentTokens,
        *,
        timeout_s: float = 10.0,
        connect_attempts: int = 3,
        max_connections: int = 256,
        ca: ReloadingContext | None = None,
    ) -> None:
        """``ca``: agents serve https with certificates from this CA (--agent-ca-file); None:
        plain http (--agent-plain-http)."""
        self._ca = ca
        self._tokens = tokens
        self._timeout_s = timeout_s
        self._attempts = connect_attempts
        self._http = AgentHttp(max_connections)
        # A wave's calls share one request (only relayed calls differ): encoded once.
        self._last_request: UpdateWeightsRequest | None = None
        self._last_body = b""

    async def _headers(self, namespace: str, pod: str) -> dict[str, str]:
        # The credential of this pod's agent alone: no other agent accepts it.
        token = await self._tokens.for_agent(namespace, pod)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def close(self) -> None:
        self._http.close()

    async def _call(
        self, method: str, ip: str, port: int, path: str, body: bytes | None, namespace: str, pod: str
    ) -> CallResult:
        return _result(await self._ask(method, ip, port, path, body, namespace, pod))

    async def _ask(
        self, method: str, ip: str, port: int, path: str, body: bytes | None, namespace: str, pod: str
    ) -> Answer | CallResult:
        """The agent's answer, or the CallResult that says why there is none. ``body``: JSON."""
        try:
            headers = await self._headers(namespace, pod)
        except AgentTokenUnavailable as exc:
            # Nothing was sent: like an agent not listening yet, the step calls again later.
            return CallResult(0, {}, str(exc), connected=False, why_none=NoAnswer.TOKEN)
        if body is not None:
            headers["Content-Type"] = "application/json"
        endpoint = self._endpoint(ip, port, namespace)
        last_error = ""
        # Only failures to connect are retried (bounded, with backoff): once a request may have
        # reached the agent, its answer or its timeout is final, so no update is sent twice.
        for attempt in range(self._attempts):
            try:
                answer = await self._http.request(endpoint, method, path, headers, body, self._timeout_s)
            except CertificateFailed as exc:
                # No retry: a wrong CA or a certificate for another namespace's name stays so;
                # the worker fails at once with the reason, not after its timeout.
                return CallResult(
                    0, {}, f"TLS verification of the agent failed: {exc.reason}", why_none=NoAnswer.TLS
                )
            except ConnectFailed as exc:
                last_error = f"cannot connect: {exc}"
                if exc.timed_out:
                    break  # the step is not held for another timeout: the next step calls again
                if attempt + 1 < self._attempts:
                    await asyncio.sleep(0.2 * 2**attempt)
            except AnswerLost as exc:
                return CallResult(0, {}, str(exc))
            else:
                return answer
        return CallResult(0, {}, last_error or "unreachable", connected=False)

    def _endpoint(self, ip: str, port: int, namespace: str) -> Endpoint:
        if self._ca is None:
            return Endpoint(ip, port)
        # The pod IP is dialled; the certificate must name the namespace's agents.
        return Endpoint(ip, port, self._ca.current(), agent_server_name(namespace))

    async def update_weights(
        self, ip: str, port: int, request: UpdateWeightsRequest, *, namespace: str, pod: str
    ) -> CallResult:
        """``namespace``, ``pod``: whose agent is called (its token is for that agent only)."""
        if request is not self._last_request:
            self._last_body, self._last_request = _json_bytes(request.to_wire()), request
        return await self._call("POST", ip, port, "/v1/update_weights", self._last_body, namespace, pod)

    async def cancel_load(self, ip: str, port: int, version: str, *, namespace: str, pod: str) -> CallResult:
        """Stop the agent's load of ``version`` (409 when another version loads, 404 when none)."""
        wire = _json_bytes(CancelLoadRequest(version=version).to_wire())
        return await self._call("POST", ip, port, "/v1/cancel_load", wire, namespace, pod)

    async def status(self, ip: str, port: int, *, namespace: str, pod: str) -> CallResult:
        answered = await self._ask("GET", ip, port, "/v1/status", None, namespace, pod)
        if isinstance(answered, CallResult) or answered.status != 200:
            return _result(answered)
        try:
            # Straight from the bytes: a pull per worker per wave, and this is half its reading.
            parsed = AgentStatus.model_validate_json(answered.body)
        except ValidationError as exc:
            # Not an answer to go by: the same as no answer (the worker timeout decides).
            return CallResult(0, _json_object(answered.body), f"invalid /v1/status body: {exc}"[:500])
        return CallResult(200, {}, agent_status=parsed)


def _result(answered: Answer | CallResult) -> CallResult:
    if isinstance(answered, CallResult):
        return answered
    return CallResult(answered.status, _json_object(answered.body))


def _json_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _json_object(raw: bytes) -> dict[str, Any]:
    """An answer's JSON object; anything else kept as its text (a proxy's page, a bare value)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return {"message": raw[:500].decode("utf-8", errors="replace")}
    return body if isinstance(body, dict) else {"body": body}
