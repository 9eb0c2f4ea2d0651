"""Raw-JSON lists and watches: an error answer raises as a preloaded call would, instead of
reaching the caches as a body without items or resourceVersion."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_rollout.io.watchstream import list_body, watch_events


@dataclass
class Answer:
    """What aiohttp hands back for one request: status, reason and the body."""

    status: int
    reason: str
    body: bytes

    async def read(self) -> bytes:
        return self.body


FORBIDDEN = json.dumps(
    {"kind": "Status", "code": 403, "message": 'configmaps "v" is forbidden: cannot list resource'}
).encode()


async def test_a_listed_body_is_returned() -> None:
    body = {"items": [], "metadata": {"resourceVersion": "7"}}
    assert await list_body(Answer(200, "OK", json.dumps(body).encode())) == body


@pytest.mark.parametrize(
    ("answer", "status", "reason"),
    [
        (Answer(403, "Forbidden", FORBIDDEN), 403, 'configmaps "v" is forbidden: cannot list resource'),
        (Answer(410, "Gone", b"{}"), 410, "Gone"),
        (Answer(502, "Bad Gateway", b"<html>"), 502, "Bad Gateway"),
    ],
    ids=["status-message", "no-message", "not-json"],
)
async def test_an_error_answer_raises(answer: Answer, status: int, reason: str) -> None:
    with pytest.raises(ApiException) as raised:
        await list_body(answer)
    assert (raised.value.status, raised.value.reason) == (status, reason)
    with pytest.raises(ApiException) as raised:
        async for _ in watch_events(answer):
            pass
    assert raised.value.status == status
