"""ckpt_rollout.io.blocking_kube against a local HTTP server standing in for the apiserver: a
429 with Retry-After is asked again (a bounded number of times), any other failure comes out at
once; an absent kubeconfig is said before the client is made."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from ckpt_rollout.io.blocking_kube import RETRIES_AFTER_429, BlockingKube

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rl"}}


class Apiserver:
    """Answers each request with the next of ``answers`` (status, Retry-After or None), the last
    one for every request after it."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, str | None]] = [(200, None)]
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, retry_after = owner.answers[min(owner.requests, len(owner.answers) - 1)]
                owner.requests += 1
                body = json.dumps(NAMESPACE if status == 200 else {"kind": "Status", "code": status}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def kubeconfig(self, path: Path) -> Path:
        port = self.server.server_address[1]
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        return path


@pytest.fixture
def apiserver() -> Iterator[Apiserver]:
    server = Apiserver()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture
def kube(apiserver: Apiserver, tmp_path: Path) -> Iterator[BlockingKube]:
    with BlockingKube.from_kubeconfig(str(apiserver.kubeconfig(tmp_path / "kubeconfig"))) as made:
        yield made


def _read(kube: BlockingKube) -> object:
    return kube.call(lambda: kube.core.read_namespace("rl"))


def test_a_429_with_retry_after_is_asked_again(apiserver: Apiserver, kube: BlockingKube) -> None:
    apiserver.answers = [(429, "0"), (429, "0"), (200, None)]
    assert _read(kube).metadata.name == "rl"  # type: ignore[attr-defined]
    assert apiserver.requests == 3


def test_retries_after_429_are_bounded(apiserver: Apiserver, kube: BlockingKube) -> None:
    apiserver.answers = [(429, "0")]
    with pytest.raises(ApiException) as caught:
        _read(kube)
    assert caught.value.status == 429
    assert apiserver.requests == 1 + RETRIES_AFTER_429


@pytest.mark.parametrize("answer", [(429, None), (503, "0"), (403, None)])
def test_other_failures_come_out_at_once(
    apiserver: Apiserver, kube: BlockingKube, answer: tuple[int, str | None]
) -> None:
    apiserver.answers = [answer]
    with pytest.raises(ApiException) as caught:
        _read(kube)
    assert caught.value.status == answer[0]
    assert apiserver.requests == 1


def test_an_absent_kubeconfig_is_said_by_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigException, match=f"no kubeconfig file at {tmp_path / 'absent'}"):
        BlockingKube.from_kubeconfig(str(tmp_path / "absent"))
