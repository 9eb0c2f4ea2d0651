"""The operator's connections to agents, against servers on 127.0.0.1 that misbehave on purpose:
a worker's call and pull share one connection; what failed is told apart by what it proves
(nothing sent, maybe received); only a GET is sent again when a kept connection was closed
under it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import EllipsisType

import pytest

from ckpt_api.tls import ReloadingContext
from ckpt_rollout.io import agent_http
from ckpt_rollout.io.agent_client import AgentClient
from ckpt_rollout.io.agent_http import AgentHttp, AnswerLost, ConnectFailed, Endpoint
from ckpt_rollout.io.agent_tokens import NoToken
from ckpt_rollout.io.http_wire import Answer

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

# What the server does with the n-th request (1-based) on a connection: the bytes it answers,
# or None to close the connection without a word, or ... to say nothing and keep it open.
Script = Callable[[int, bytes], "bytes | EllipsisType | None"]


@dataclass
class Server:
    port: int
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


async def _serve(script: Script) -> tuple[asyncio.Server, Server]:
    state = Server(0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        n = 0
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                request = head + await reader.readexactly(length)
                n += 1
                state.requests.append(request.split(b"\r\n", 1)[0])
                what = script(n, request)
                if what is None:
                    break
                if what is Ellipsis:
                    await reader.read()  # silent until the client hangs up
                    break
                assert isinstance(what, bytes)
                writer.write(what)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    return server, state


@pytest.fixture
async def http() -> AsyncIterator[AgentHttp]:
    client = AgentHttp(max_connections=8)
    yield client
    client.close()


async def test_a_workers_call_and_pull_share_one_connection(http: AgentHttp) -> None:
    server, state = await _serve(lambda n, _: OK)
    async with server:
        where = Endpoint("127.0.0.1", state.port)
        post = await http.request(where, "POST", "/v1/update_weights", {}, b"{}", 5)
        get = await http.request(where, "GET", "/v1/status", {}, None, 5)
    assert post == get == Answer(200, b"{}", keep_alive=True)
    assert state.connections == 1
    assert state.requests == [b"POST /v1/update_weights HTTP/1.1", b"GET /v1/status HTTP/1.1"]


async def test_a_connection_idle_past_its_reuse_is_not_used(
    http: AgentHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_http, "IDLE_REUSE_S", 0.0)
    server, state = await _serve(lambda n, _: OK)
    async with server:
        where = Endpoint("127.0.0.1", state.port)
        for _ in range(3):
            await http.request(where, "GET", "/v1/status", {}, None, 5)
    assert state.connections == 3


async def test_a_connection_the_server_closes_is_not_used_again(http: AgentHttp) -> None:
    server, state = await _serve(lambda n, _: OK.replace(b"OK\r\n", b"OK\r\nConnection: close\r\n"))
    async with server:
        where = Endpoint("127.0.0.1", state.port)
        for _ in range(2):
            assert (await http.request(where, "GET", "/v1/status", {}, None, 5)).keep_alive is False
    assert state.connections == 2


@pytest.mark.parametrize(("method", "sent_again"), [("GET", True), ("POST", False)])
async def test_a_kept_connection_closed_under_a_request(
    http: AgentHttp, method: str, sent_again: bool
) -> None:
    # The first connection answers once, then closes on the next request unanswered (as an agent
    # whose idle timeout fires just as the request arrives); later connections answer.
    server, state = await _serve(lambda n, _: OK if n == 1 else None)
    async with server:
        where = Endpoint("127.0.0.1", state.port)
        await http.request(where, "GET", "/v1/status", {}, None, 5)
        if sent_again:
            assert await http.request(where, method, "/v1/x", {}, b"{}", 5) == Answer(200, b"{}", True)
        else:
            with pytest.raises(AnswerLost, match="closed mid-answer"):
                await http.request(where, method, "/v1/x", {}, b"{}", 5)
    assert state.connections == (2 if sent_again else 1), "a POST that may have arrived is not sent twice"


async def test_silence_is_no_answer_in_time_and_the_connection_goes(http: AgentHttp) -> None:
    # The first connection stays silent; the next one answers.
    server, state = await _serve(lambda n, _: OK if state.connections > 1 else ...)
    async with server:
        where = Endpoint("127.0.0.1", state.port)
        with pytest.raises(AnswerLost, match="TimeoutError"):
            await http.request(where, "POST", "/v1/update_weights", {}, b"{}", 0.2)
        assert (await http.request(where, "GET", "/v1/status", {}, None, 5)).status == 200
    assert state.connections == 2


async def test_garbage_is_no_answer(http: AgentHttp) -> None:
    server, state = await _serve(lambda n, _: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    async with server:
        with pytest.raises(AnswerLost, match="no HTTP status line"):
            await http.request(Endpoint("127.0.0.1", state.port), "GET", "/v1/status", {}, None, 5)


async def test_nobody_listening_is_a_failed_connect(http: AgentHttp) -> None:
    server, state = await _serve(lambda n, _: OK)
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectFailed):
        await http.request(Endpoint("127.0.0.1", state.port), "POST", "/v1/update_weights", {}, b"{}", 5)


async def test_a_handshake_that_never_ends_is_a_connect_that_ran_out_of_time(http: AgentHttp) -> None:
    server, state = await _serve(lambda n, _: OK)  # speaks no TLS: the handshake hangs
    async with server:
        where = Endpoint("127.0.0.1", state.port, ssl.create_default_context(), "agents.example")
        with pytest.raises(ConnectFailed) as failed:
            await http.request(where, "GET", "/v1/status", {}, None, 0.3)
    assert failed.value.timed_out


async def test_a_client_is_not_held_for_a_second_timeout_by_a_connect_that_ran_out() -> None:
    server, state = await _serve(lambda n, _: OK)
    tls = ReloadingContext((), ssl.create_default_context)
    client = AgentClient(NoToken(), timeout_s=0.3, connect_attempts=3, ca=tls)
    async with server:
        result = await client.status("127.0.0.1", state.port, namespace="team-a", pod="w-0")
    await client.close()
    assert (result.status, result.connected, state.connections) == (0, False, 1)
    assert "no connection in time" in result.error
