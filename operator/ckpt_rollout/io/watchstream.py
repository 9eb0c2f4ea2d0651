"""Lists and watches read as raw JSON (``_preload_content=False``): the body of a list, and a
watch stream of one event per line."""

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

# A list (not a watch): a whole namespace's pods may take a while, a hung apiserver forever.
LIST_TIMEOUT_S = 60.0


def raise_for_status(resp: Any, body: bytes) -> None:
    """An error answer as the ApiException a preloaded call raises: with _preload_content=False
    the client hands back a 403 or 410 like any other response, whose Status body has no items."""
    if resp.status < 400:
        return
    try:
        message = json.loads(body).get("message") or resp.reason
    except ValueError:
        message = resp.reason
    raise ApiException(status=resp.status, reason=message)


async def list_body(resp: Any) -> dict[str, Any]:
    raw = await resp.read()
    raise_for_status(resp, raw)
    body: dict[str, Any] = json.loads(raw)
    return body


async def watch_events(resp: Any) -> AsyncIterator[dict[str, Any]]:
    """A watch stream: one JSON object per line; lines may span reads and exceed any buffer."""
    if resp.status >= 400:
        raise_for_status(resp, await resp.read())
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)


async def follow(resp: Any, version: str, apply: Callable[[str, dict[str, Any]], None]) -> str:
    """Feed a watch's events to ``apply(type, object)`` until the server ends it; returns the
    last resourceVersion seen (bookmarks only move it on). An ERROR event (typically 410 Gone)
    raises its ApiException: the caller relists."""
    try:
        async for event in watch_events(resp):
            kind, obj = str(event.get("type")), event.get("object") or {}
            if kind == "ERROR":
                raise ApiException(status=obj.get("code"), reason=obj.get("message"))
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if kind != "BOOKMARK":
                apply(kind, obj)
    finally:
        resp.release()
    return version
