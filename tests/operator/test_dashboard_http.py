"""The dashboard's HTTP face over real sockets on 127.0.0.1: the page is served without the
token, everything it reads or does needs it, Host headers off the allow-list are refused even
bound to every address, and no reply may be framed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from ckpt_rollout.tools import actions
from ckpt_rollout.tools.actions import ActionError
from ckpt_rollout.tools.dashboard import TOKEN_HEADER, Board, Dashboard, allowed_hosts, serve


@dataclass
class Served:
    dashboard: Dashboard
    url: str
    port: int
    session: aiohttp.ClientSession


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    # No apiserver is needed for what these tests ask: actions are refused before reaching it.
    dashboard = Dashboard(api=None, namespace="rl", board=Board())
    runner = web.AppRunner(dashboard.app(), access_log=None, handle_signals=False, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = int(runner.addresses[0][1])
    # As `--address 0.0.0.0 --allowed-hosts dash.internal` would have it.
    dashboard.hosts = allowed_hosts("0.0.0.0", port, ["dash.internal"])
    async with aiohttp.ClientSession() as session:
        yield Served(dashboard, f"http://127.0.0.1:{port}", port, session)
    await runner.cleanup()


async def test_the_page_is_served_without_the_token_and_never_framed(served: Served) -> None:
    async with served.session.get(served.url + "/") as resp:
        assert resp.status == 200
        page = await resp.text()
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
    assert served.dashboard.token not in page
    # The URL the command prints carries it where a browser keeps it to itself.
    assert served.dashboard.url == f"#token={served.dashboard.token}"


async def test_reads_and_actions_need_the_token(served: Served) -> None:
    token = served.dashboard.token
    wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # never the token itself
    for method, path in (
        ("GET", "/api/rollouts"),
        ("GET", "/api/events"),
        ("POST", "/api/rollouts/rl/a/pause"),
    ):
        for headers in ({}, {TOKEN_HEADER: wrong}):
            async with served.session.request(method, served.url + path, headers=headers) as resp:
                assert resp.status == 403, (path, headers)
                assert resp.headers["X-Frame-Options"] == "DENY"
    async with served.session.get(served.url + "/api/rollouts", headers={TOKEN_HEADER: token}) as resp:
        assert resp.status == 200
        assert (await resp.json())["rollouts"] == []
    # EventSource sends no headers: the page's stream passes the token as a parameter.
    async with served.session.get(served.url + "/api/events", params={"token": token}) as resp:
        assert resp.status == 200
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert (await resp.content.readline()).startswith(b"data: ")
    async with served.session.post(
        served.url + "/api/rollouts/rl/a/launch", headers={TOKEN_HEADER: token}
    ) as resp:
        assert resp.status == 404  # past the token: an unknown action


async def test_a_host_off_the_list_is_refused_even_bound_to_every_address(served: Served) -> None:
    token = served.dashboard.token
    for host in ("evil.example", f"evil.example:{served.port}", f"dash.internal.evil.example:{served.port}"):
        for path in ("/", "/api/rollouts"):
            async with served.session.get(
                served.url + path, headers={"Host": host, TOKEN_HEADER: token}
            ) as resp:
                assert resp.status == 421, (host, path)
    for host in (f"dash.internal:{served.port}", f"localhost:{served.port}"):
        async with served.session.get(
            served.url + "/api/rollouts", headers={"Host": host, TOKEN_HEADER: token}
        ) as resp:
            assert resp.status == 200, host


async def test_binding_every_address_without_names_is_refused_before_connecting() -> None:
    target = actions.Target(kubeconfig="/nonexistent/kubeconfig", context=None, namespace="rl")
    with pytest.raises(ActionError, match="--allowed-hosts") as refused:
        await serve(target, False, "0.0.0.0", 0)
    assert refused.value.code == 2
