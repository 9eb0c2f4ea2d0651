"""A tiny stdlib HTTPS client for the apiserver, used while bringing the cluster up.

The runner must not depend on the kubernetes client (the `make cluster-up` path runs it
before tests import anything heavy), and it needs only a handful of calls.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ckpt_api.vocabulary import ConditionStatus, KubeConditionType


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class KubeAPI:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server.rstrip("/")
        self._ctx = ssl.create_default_context(cafile=str(ca))
        self._ctx.load_cert_chain(str(cert), str(key))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")) from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    def ok(self, path: str) -> bool:
        """True when GET `path` answers 2xx; connection errors count as not yet."""
        try:
            self.request("GET", path, timeout=2.0)
        except (ApiError, OSError):
            return False
        return True


def condition_status(obj: dict[str, Any], kind: str) -> str | None:
    """The status ("True", "False", "Unknown") of an object's condition of that type, if any."""
    status = obj.get("status")
    if not isinstance(status, dict):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def is_ready(obj: dict[str, Any]) -> bool:
    """A node's or pod's Ready condition is True."""
    return condition_status(obj, KubeConditionType.READY) == ConditionStatus.TRUE
