"""ckpt_agent_auth_failures_total{reason}: each call the agent turns away is counted under why
(missing: no bearer token; invalid: a token that is not the accepted one), so an SRE can alert
on a caller with a stale or wrong credential; calls that get through are not counted."""

from __future__ import annotations

from pathlib import Path

from agent_testkit import AgentFactory, Tree

from ckpt_agent.config import AuthConfig

FAILURES = "ckpt_agent_auth_failures_total"
GOOD = {"Authorization": "Bearer s3cret-token"}


async def test_each_rejected_call_is_counted_under_its_reason(
    tree: Tree, agent_factory: AgentFactory, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    client = await agent_factory(source=tree.file_uri, auth=AuthConfig(token_file=token_file))
    turned_away = [
        ({}, "missing"),
        ({"Authorization": "Basic czNjcmV0"}, "missing"),  # not a bearer token at all
        ({"Authorization": "Bearer"}, "missing"),
        ({"Authorization": "Bearer wrong"}, "invalid"),
        ({"Authorization": "Bearer s3cret-token-old"}, "invalid"),
    ]
    for headers, _ in turned_away:
        client.headers = headers
        code, body = await client.request("GET", "/v1/status")
        assert code == 401, (headers, body)
    client.headers = GOOD
    for _ in range(3):  # let through: never counted
        assert (await client.request("GET", "/v1/status"))[0] == 200

    counted = {r: await client.metric(FAILURES, {"reason": r}) for r in ("missing", "invalid", "forbidden")}
    expected = {r: float(sum(1 for _, why in turned_away if why == r)) for r in counted}
    assert counted == expected
    assert await client.metric(FAILURES) == len(turned_away)
