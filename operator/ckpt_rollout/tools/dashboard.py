"""`ckpt-rollout dashboard`: a local web page of the CheckpointRollouts in a namespace (or all),
live, with the commands' pause, resume, promote, abort and retry as buttons.

A watch on the apiserver (one thread: list, then watch from the list's resourceVersion, list
again when that version is too old) keeps a board of the rollouts, and a second one the pods
(so every worker a rollout selects shows, called or not); every change reaches each open page
as a server-sent event carrying the whole board (watchtable's view of each rollout), so the page
redraws without reloading. Buttons POST to the server, which runs the very function
the CLI command runs (ckpt_rollout.tools.actions) with the user's kubeconfig.

It acts with the user's credentials, so it listens on 127.0.0.1 unless told otherwise and
answers only requests whose Host header is on its allow-list (the bound address, localhost when
that is loopback, and the names given with --allowed-hosts; bound to every address it needs
those names): a page on another site whose name is rebound to this address (DNS rebinding)
still sends its own name. Reads and actions need a per-process token that the page is never
served with: the command prints the URL with the token in its fragment (which browsers do not
send), the page keeps it in its tab's session storage and drops it from the address bar, so
neither another site's page nor another local user can fetch it. Every reply forbids framing.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import ipaddress
import json
import secrets
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web

from ckpt_rollout.tools import actions
from ckpt_rollout.tools.actions import EXIT_NOT_FOUND, EXIT_REFUSED, ActionError
from ckpt_rollout.tools.watchtable import rollout_view

TOKEN_HEADER = "X-Dashboard-Token"  # noqa: S105 (a header name, not a secret)
# EventSource cannot send headers: the page's event stream passes the token as this parameter.
TOKEN_PARAM = "token"  # noqa: S105 (a parameter name, not a secret)
# Clickjacking: no page of another site may frame this one (buttons act with the user's
# credentials); the referrer policy keeps the page's address out of anything it links to.
SAFETY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
WATCH_SECONDS = 30  # one watch request's length; the next resumes from the last version seen
RETRY_SECONDS = 2.0  # after the apiserver failed us
PODS_RETRY_SECONDS = 30.0  # after a pods list or watch failed (e.g. RBAC grants none)
KEEPALIVE_SECONDS = 15.0  # an idle event stream still notices a closed page
_HTTP_STATUS = {EXIT_NOT_FOUND: 404, EXIT_REFUSED: 409}  # any other failure: 502


def board_view(
    objects: dict[tuple[str, str], dict[str, Any]],
    error: str | None,
    pods: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """What one event carries: every rollout's view (with the ``pods``, by namespace and name,
    its selector selects), each with why each action would be refused now (None: it applies),
    and the watch's last error."""
    rollouts = []
    for key in sorted(objects):
        view = rollout_view(objects[key], actions.selected(objects[key], (pods or {}).get(key[0], {})))
        view["refusals"] = {action: actions.refusal(action, objects[key]) for action in actions.ACTIONS}
        rollouts.append(view)
    return {"rollouts": rollouts, "error": error}


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


@dataclass
class Board:
    """The rollouts as last seen, and a generation counter that open pages wait on. Touched only
    on the event loop: the watch thread hands its events over with call_soon_threadsafe."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    # namespace -> pod name -> actions.pod_summary: what shows every selected worker, not only
    # those a rollout has called. Stays empty where the user may not watch pods.
    pods: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    generation: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def replace(self, objects: dict[tuple[str, str], dict[str, Any]], error: str | None) -> None:
        self.objects = objects
        self.error = error
        self._bump()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.objects.pop(_key(obj), None)
        else:
            self.objects[_key(obj)] = obj
        self.error = None
        self._bump()

    def replace_pods(self, listed: dict[tuple[str, str], dict[str, Any]], _error: str | None) -> None:
        self.pods = {}
        for pod in listed.values():
            self.apply_pod("ADDED", pod)

    def apply_pod(self, kind: str, pod: dict[str, Any]) -> None:
        summary = actions.pod_summary(pod)
        pods = self.pods.setdefault(str(summary["namespace"]), {})
        name = str(summary["name"])
        if kind == "DELETED":
            changed = pods.pop(name, None) is not None
        else:
            changed, pods[name] = pods.get(name) != summary, summary
        if changed:  # most pod events change nothing shown (conditions, container states)
            self._bump()

    def fail(self, error: str) -> None:
        self.error = error
        self._bump()

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_past(self, generation: int) -> None:
        while self.generation == generation:
            await self._changed.wait()

    def event(self) -> bytes:
        return f"data: {json.dumps(board_view(self.objects, self.error, self.pods))}\n\n".encode()


@dataclass(frozen=True)
class Feed:
    """What a watch thread follows and where its news go on the board."""

    list: Callable[[], dict[str, Any]]
    watch: Callable[[str | None], Iterable[dict[str, Any]]]  # from a resourceVersion
    replace: Callable[[dict[tuple[str, str], dict[str, Any]], str | None], None]
    apply: Callable[[str, dict[str, Any]], None]
    fail: Callable[[str], None]
    retry_s: float = RETRY_SECONDS


def rollouts_feed(api: Any, namespace: str | None, board: Board) -> Feed:
    return Feed(
        lambda: actions.list_rollouts(api, namespace),
        lambda version: actions.watch_events(api, namespace, version, WATCH_SECONDS),
        board.replace,
        board.apply,
        board.fail,
    )


def pods_feed(api: Any, namespace: str | None, board: Board) -> Feed:
    # A user who may not watch pods still has the board of rollouts: no error shown, a slow retry.
    return Feed(
        lambda: actions.list_pods(api, namespace),
        lambda version: actions.watch_pod_events(api, namespace, version, WATCH_SECONDS),
        board.replace_pods,
        board.apply_pod,
        lambda _error: None,
        retry_s=PODS_RETRY_SECONDS,
    )


def follow(
    feed: Feed, listed: dict[str, Any] | None, loop: asyncio.AbstractEventLoop, stop: threading.Event
) -> None:
    """A watch thread: from ``listed`` on (None: list first), every change goes to the board,
    until ``stop``."""
    while not stop.is_set():
        try:
            if listed is None:
                listed = feed.list()
            items = {_key(obj): obj for obj in listed.get("items") or []}
            loop.call_soon_threadsafe(feed.replace, items, None)
            version = (listed.get("metadata") or {}).get("resourceVersion")
            listed = None  # from here on, a new list is needed only when the watch says so
            gone = False
            while not gone and not stop.is_set():
                for event in feed.watch(version):
                    kind = event.get("type")
                    if kind in ("GONE", "ERROR"):
                        gone = True
                        break
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        loop.call_soon_threadsafe(feed.apply, kind, obj)
        except Exception as exc:  # the apiserver went away, RBAC changed: say so on the page, retry
            listed = None
            loop.call_soon_threadsafe(feed.fail, f"watch: {exc}".splitlines()[0][:300])
            if stop.wait(feed.retry_s):
                return


@dataclass
class Dashboard:
    api: Any
    namespace: str | None  # None: every namespace
    board: Board
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    hosts: frozenset[str] = frozenset()  # Host headers answered (allowed_hosts)

    @property
    def url(self) -> str:
        """What to open: the token rides in the fragment, which the browser keeps to itself."""
        return f"#{TOKEN_PARAM}={self.token}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._host_check, self._token_check])
        app.on_response_prepare.append(self._safety_headers)
        app.router.add_get("/", self.page)
        app.router.add_get("/api/rollouts", self.rollouts)
        app.router.add_get("/api/events", self.events)
        app.router.add_post("/api/rollouts/{namespace}/{name}/{action}", self.act)
        return app

    @web.middleware
    async def _host_check(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # A page on another site that gets its name resolved to 127.0.0.1 (DNS rebinding)
        # still sends its own name as Host.
        if request.host not in self.hosts:
            return web.json_response({"error": f"unexpected Host header {request.host!r}"}, status=421)
        response: web.StreamResponse = await handler(request)
        return response

    @web.middleware
    async def _token_check(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # The page itself is public (it holds no secret); everything it reads or does is not.
        sent = request.headers.get(TOKEN_HEADER) or request.query.get(TOKEN_PARAM, "")
        if request.path != "/" and not hmac.compare_digest(sent.encode(), self.token.encode()):
            return web.json_response(
                {"error": "open the URL the dashboard printed (it carries the page's token)"}, status=403
            )
        response: web.StreamResponse = await handler(request)
        return response

    @staticmethod
    async def _safety_headers(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(SAFETY_HEADERS)

    async def page(self, request: web.Request) -> web.Response:
        text = resources.files("ckpt_rollout.tools").joinpath("static/dashboard.html").read_text()
        scope = "all namespaces" if self.namespace is None else f"namespace {self.namespace}"
        text = text.replace("__SCOPE__", html.escape(scope))
        return web.Response(text=text, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def rollouts(self, request: web.Request) -> web.Response:
        return web.json_response(board_view(self.board.objects, self.board.error, self.board.pods))

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        seen = -1
        try:
            while True:
                if seen != self.board.generation:
                    seen = self.board.generation
                    await response.write(self.board.event())
                try:
                    await asyncio.wait_for(self.board.wait_past(seen), KEEPALIVE_SECONDS)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
        except ConnectionResetError:  # the page was closed
            return response

    async def act(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if action not in actions.ACTIONS:
            known = ", ".join(actions.ACTIONS)
            return web.json_response({"error": f"unknown action {action!r} (one of {known})"}, status=404)
        if self.namespace is not None and namespace != self.namespace:
            return web.json_response(
                {"error": f"this dashboard shows namespace {self.namespace}, not {namespace}"}, status=404
            )
        try:
            message = await asyncio.to_thread(actions.ACTIONS[action], self.api, namespace, name)
        except ActionError as exc:
            return web.json_response({"error": str(exc)}, status=_HTTP_STATUS.get(exc.code, 502))
        return web.json_response({"message": message})


def allowed_hosts(address: str, port: int, names: Iterable[str] = ()) -> frozenset[str]:
    """Host headers answered when bound to `address`: that address, localhost when it is
    loopback (or every address), and `names` (--allowed-hosts), each with the port. Bound to
    every address, which names reach it is the user's to say: without `names` that is refused
    (ValueError), as answering any Host would let a rebound name act as the user."""
    ip = ipaddress.ip_address(address)
    given = [n.strip() for n in names if n.strip()]
    if ip.is_unspecified and not given:
        raise ValueError(
            f"bound to every address ({address}), the dashboard answers only the names you list: "
            "pass --allowed-hosts NAME[,NAME...] (the names or addresses you will open it by)"
        )
    listed = [] if ip.is_unspecified else [address]
    if ip.is_loopback or ip.is_unspecified:
        listed += ["localhost", "127.0.0.1", "::1"] if ip.is_unspecified else ["localhost"]
    hosts = set()
    for name in [*listed, *given]:
        try:
            literal = ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            hosts.add(f"{name.lower()}:{port}")
        else:
            hosts.add(f"[{literal}]:{port}" if literal.version == 6 else f"{literal}:{port}")
    return frozenset(hosts)


def _bracketed(name: str) -> str:
    name = name.strip().strip("[]")
    return f"[{name}]" if ":" in name else name


async def serve(
    target: actions.Target, all_namespaces: bool, address: str, port: int, names: Iterable[str] = ()
) -> int:
    try:
        allowed_hosts(address, port, names)  # refused before anything else happens
    except ValueError as exc:
        raise ActionError(str(exc), 2) from None
    api, namespace = actions.connect(target)
    scope = None if all_namespaces else namespace
    # Listed before listening: a kubeconfig that cannot read rollouts fails here, in one line.
    listed = await asyncio.to_thread(actions.list_rollouts, api, scope)
    board = Board()
    dashboard = Dashboard(api, scope, board)
    runner = web.AppRunner(dashboard.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ActionError(f"cannot listen on {address}:{port}: {exc.strerror or exc}", 2) from None
    bound = int(runner.addresses[0][1])
    dashboard.hosts = allowed_hosts(address, bound, names)
    stop_watch = threading.Event()
    loop = asyncio.get_running_loop()
    for name, feed, first in (
        ("ckpt-dashboard-watch", rollouts_feed(api, scope, board), listed),
        ("ckpt-dashboard-pods", pods_feed(api, scope, board), None),
    ):
        threading.Thread(target=follow, args=(feed, first, loop, stop_watch), name=name, daemon=True).start()
    stopped = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    host = f"[{address}]" if ":" in address else address
    shown = "all namespaces" if scope is None else f"namespace {scope}"
    # The URL ends the line, as the agent's and `serve`'s banners do: scripts read it from there.
    print(f"ckpt-rollout dashboard of {shown} (Ctrl-C stops) on http://{host}:{bound}", flush=True)
    # Its own line, after the banner that scripts parse: the page's token is in it. Bound to
    # every address, the page is opened by a name it answers to.
    opened = host if not ipaddress.ip_address(address).is_unspecified else _bracketed(next(iter(names)))
    print(f"open http://{opened}:{bound}/{dashboard.url}", flush=True)
    try:
        await stopped.wait()
    finally:
        stop_watch.set()
        await runner.cleanup()
    return 0
