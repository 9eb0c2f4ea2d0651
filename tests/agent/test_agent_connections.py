"""What an unauthenticated client can hold of an agent: a connection that never delivers a
complete request head is closed after the idle timeout (trickled bytes do not extend it), an
idle keep-alive connection likewise, and connections past the cap are answered 503 and closed
while those already open are still served. Real sockets on 127.0.0.1 against a real agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

from agent_testkit import AgentClient, AgentFactory, Tree, static_token_agent, wait_until

from ckpt_agent.cli import build_parser, config_from_args
from ckpt_agent.server.httpserver import ConnectionLimits

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"
# Generous next to the idle timeouts below: only a connection that is never closed reaches it.
CLOSE_LIMIT_S = 15.0

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def connections(client: AgentClient, count: int) -> AsyncIterator[list[Conn]]:
    url = urlsplit(client.url)
    assert url.hostname is not None
    assert url.port is not None
    opened = [await asyncio.open_connection(url.hostname, url.port) for _ in range(count)]
    try:
        yield opened
    finally:
        for _, writer in opened:
            writer.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed the connection (fails if it never does). A
    server that closes while the client still writes has the kernel reset the connection: that
    is a close too, with nothing delivered (b"")."""
    try:
        return await asyncio.wait_for(reader.read(), CLOSE_LIMIT_S)
    except ConnectionResetError:
        return b""


async def healthz(conn: Conn) -> bytes:
    reader, writer = conn
    writer.write(HEALTHZ)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_LIMIT_S)
    lengths = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
    await reader.readexactly(int(lengths[0].split(b":")[1]))
    return head.split(b"\r\n", 1)[0]


async def test_silent_and_idle_connections_are_closed(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    client = await static_token_agent(
        agent_factory, token_file, source=tree.file_uri, connections=ConnectionLimits(idle_timeout_s=0.5)
    )
    async with connections(client, 16) as silent:
        for reader, _ in silent:
            assert await closed_by_server(reader) == b""
    async with connections(client, 1) as (served,):
        assert await healthz(served) == b"HTTP/1.1 200 OK"
        assert await closed_by_server(served[0]) == b""  # idle after its response


async def test_a_request_head_trickled_in_does_not_keep_the_connection(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    client = await static_token_agent(
        agent_factory, token_file, source=tree.file_uri, connections=ConnectionLimits(idle_timeout_s=0.5)
    )
    async with connections(client, 1) as ((reader, writer),):
        writer.write(b"GET /v1/status HTTP/1.1\r\nHost: agent\r\n")

        async def trickle() -> None:
            # One header byte at a time, each well inside the idle timeout: the server must close
            # the connection anyway, at which point the loop ends (never by itself).
            with_bytes = b"X-Slow: " + b"a" * 10_000
            for byte in with_bytes:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        feeder = asyncio.create_task(trickle())
        try:
            reply = await closed_by_server(reader)
        finally:
            feeder.cancel()
        assert b"200" not in reply


async def test_connections_past_the_cap_are_answered_503_and_the_open_ones_still_served(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    client = await static_token_agent(
        agent_factory, token_file, source=tree.file_uri, connections=ConnectionLimits(max_connections=4)
    )
    server = client.agent.server

    async def all_counted(n: int) -> bool:
        return server.open_connections == n

    async with connections(client, 4) as held:
        await wait_until(lambda: all_counted(4), CLOSE_LIMIT_S, "the server to count 4 connections")
        async with connections(client, 1) as ((reader, _),):
            reply = await closed_by_server(reader)
        assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), reply
        assert b"Retry-After: 1\r\n" in reply
        assert await healthz(held[0]) == b"HTTP/1.1 200 OK"
        held[3][1].close()
        await wait_until(lambda: all_counted(3), CLOSE_LIMIT_S, "the closed connection to be freed")
        async with connections(client, 1) as (fresh,):
            assert await healthz(fresh) == b"HTTP/1.1 200 OK"


def test_the_flags_set_the_limits_and_default_to_a_bounded_server() -> None:
    parser = build_parser()
    default = config_from_args(parser.parse_args(["agent", "--no-auth"]), env={})
    assert default.connections == ConnectionLimits()
    assert default.connections.idle_timeout_s < 70  # aiohttp's own keep-alive is about an hour
    set_ = config_from_args(
        parser.parse_args(["agent", "--no-auth", "--idle-timeout", "5", "--max-connections", "32"]), env={}
    )
    assert set_.connections == ConnectionLimits(idle_timeout_s=5.0, max_connections=32)
