"""One list+watch kept in step with the apiserver: list page by page, watch from the list's
version, relist at once after a 410 Gone and after a pause on any other error.

The caches built on it (io.podcache, io.configmaps) say what they keep: a reflector hands them
each full list, as it is read, and then every watch event, raw JSON (``_preload_content=False``)
so that nothing the apiserver sends is turned into client models no cache reads."""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_rollout.io.watchstream import LIST_TIMEOUT_S, follow, list_body

log = logging.getLogger(__name__)

LIST_PAGE = 500
RETRY_S = 2.0
DENIED_RETRY_S = 10.0  # RBAC changes are rare: don't hammer the apiserver meanwhile

# A list call of the client (e.g. CoreV1Api.list_namespaced_pod with its positional arguments
# bound): the reflector adds the paging, watch and timeout keywords.
ListCall = Callable[..., Awaitable[Any]]
# Takes a whole list, item by item; it must read to the end (the version is on the last page).
Replace = Callable[[AsyncIterator[dict[str, Any]]], Awaitable[None]]
Apply = Callable[[str, dict[str, Any]], None]


class Reflector:
    def __init__(
        self,
        what: str,
        list_call: ListCall,
        replace: Replace,
        apply: Apply,
        watch_timeout_s: int,
        denied: Callable[[ApiException], None] | None = None,
    ) -> None:
        """``what`` names the followed objects in logs; ``denied`` hears a 401 or 403, so that
        what depends on the objects can say it cannot read them."""
        self._what = what
        self._list_call = list_call
        self._replace = replace
        self._apply = apply
        self._watch_timeout_s = watch_timeout_s
        self._denied = denied

    async def run(self) -> None:
        """Follow until cancelled."""
        while True:
            try:
                version = await self._relist()
                while True:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:  # the version is too old: relist at once
                    continue
                denied = exc.status in (401, 403)
                if denied and self._denied is not None:
                    self._denied(exc)
                log.warning("%s: API error %s; relisting", self._what, exc.status)
                await asyncio.sleep(DENIED_RETRY_S if denied else RETRY_S)
            except Exception as exc:  # keep following; the next list repairs any gap
                log.warning("%s: %r; relisting in %.0fs", self._what, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _call(self, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", LIST_TIMEOUT_S)  # a watch passes its own
        return await self._list_call(_preload_content=False, **kwargs)

    async def _relist(self) -> str:
        version: str | None = None

        async def items() -> AsyncIterator[dict[str, Any]]:
            nonlocal version
            token: str | None = None
            while True:
                body = await list_body(
                    await self._call(limit=LIST_PAGE, **({"_continue": token} if token else {}))
                )
                for item in body.get("items") or []:
                    yield item
                token = body.get("metadata", {}).get("continue")
                if not token:
                    version = str(body["metadata"]["resourceVersion"])
                    return

        await self._replace(items())
        if version is None:
            raise RuntimeError(f"{self._what}: the list was not read to its end")
        return version

    async def _watch(self, version: str) -> str:
        resp = await self._call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s,
            _request_timeout=self._watch_timeout_s + 30,
        )
        return await follow(resp, version, self._apply)
