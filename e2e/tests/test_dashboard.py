"""`ckpt-rollout dashboard` in a real browser (headless Chromium, driven by playwright) against the
local control plane, a real operator and real agents: the page shows a rollout, its waves and
its workers and follows them live, without reloading; each button changes the CR exactly as its
CLI command does. A screenshot lands in the test's tmp dir, and in $CKPT_SCREENSHOT_DIR when set
(README's docs/dashboard.png comes from `CKPT_SCREENSHOT_DIR=docs`)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_api.vocabulary import ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION
from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.procs import spawn_server, stop, wait_for
from ckpt_e2e.rollout_env import CLI, CheckpointSource, OperatorProcess, Rollouts, rollout_spec
from ckpt_e2e.rollout_fixtures import Fleet

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
NAME = "fleet"
LIVE_S = 120_000  # ms: the longest a page may take to show what the operator did


@pytest.fixture
def dashboard(cluster: ClusterHandle, namespace: str, tmp_path: Path) -> Iterator[str]:
    proc, url = spawn_server(
        [*CLI, "dashboard", "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "--port", "0"],
        tmp_path / "dashboard.log",
        "ckpt-rollout dashboard",
    )
    yield url
    stop(proc)


@pytest.fixture
def dashboard_token(dashboard: str, tmp_path: Path) -> str:
    """The token from the URL the command prints under its banner (in the fragment: the page is
    served without it)."""

    def printed() -> str | None:
        for line in (tmp_path / "dashboard.log").read_text().splitlines():
            if line.startswith(f"open {dashboard}/#token="):
                return line.split("#token=", 1)[1].strip()
        return None

    return wait_for(printed, 10, "the dashboard's URL with its token")


@pytest.fixture
def page(dashboard: str, dashboard_token: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), (
        f"{CHROMIUM} missing: `make test` installs it (scripts/install-system-deps.sh browser)"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.on("dialog", lambda dialog: dialog.accept())  # abort asks for confirmation
        page.goto(f"{dashboard}/#token={dashboard_token}")
        yield page
        browser.close()


def _annotations(rollouts: Rollouts) -> dict[str, str]:
    return dict(rollouts.get(NAME)["metadata"].get("annotations") or {})


def test_the_page_follows_a_rollout_live_and_its_buttons_act_like_the_cli(
    page: Any,
    dashboard: str,
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    namespace: str,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    fleet = fleet_factory(3)
    expect(page.locator("#live")).to_have_text("live", timeout=30_000)
    assert "token=" not in page.url, "the page drops its token from the address bar"
    expect(page.locator("#empty")).to_be_visible()
    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page

    rollouts.create(
        NAME,
        rollout_spec(
            checkpoint_source.url, "v2", fleet.labels, strategy={"waves": [1, "100%"], "pauseAfterWave": [0]}
        ),
    )
    card = page.locator(f'[data-rollout="{namespace}/{NAME}"]')
    expect(card).to_have_attribute("data-phase", "Paused", timeout=LIVE_S)
    status = rollouts.status(NAME)
    (canary,) = status["waves"][0]["pods"]
    expect(card.locator('tr[data-wave="1"]')).to_have_attribute("data-phase", "Completed")
    chip = card.locator(f'tr[data-wave="1"] [data-pod="{canary}"]')
    expect(chip).to_have_attribute("data-state", "Updated")
    expect(card.locator(f'tr[data-worker="{canary}"]')).to_have_attribute("data-state", "Updated")
    # Every selected worker has a row, called or not; a completed wave says what it folded.
    expect(card.locator("tr[data-worker]")).to_have_count(3)
    expect(card.locator('tr[data-worker][data-state="Pending"]')).to_have_count(2)
    expect(card.locator('tr[data-worker][data-state="Pending"] .message').first).to_have_text(
        "in no wave yet"
    )
    expect(card.locator(f'tr[data-worker="{canary}"] .message')).to_have_text("figures folded into wave 1")
    expect(card.locator('tr[data-wave="1"] .summary')).to_contain_text("1 updated, 0 failed, 0 gone; folded")
    expect(card.locator(".version")).to_have_text("v2")
    expect(card.locator(".updated")).to_have_text("1/3")
    expect(card.locator('button[data-action="promote"]')).to_be_enabled()
    expect(card.locator('button[data-action="retry"]')).to_be_disabled()
    expect(card.locator('button[data-action="resume"]')).to_be_disabled()

    # Promote: the annotation `ckpt-rollout promote` writes, then wave 2 runs to the end.
    card.locator('button[data-action="promote"]').click()
    expect(card.locator(".result")).to_have_text(f"{NAME}: promoted past wave 1")
    assert _annotations(rollouts)[PROMOTE_ANNOTATION] == "0@v2"
    expect(card).to_have_attribute("data-phase", "Succeeded", timeout=LIVE_S)
    expect(card.locator('tr[data-wave="2"]')).to_have_attribute("data-phase", "Completed")
    members = card.locator('tr[data-wave="2"] [data-pod]')
    expect(members).to_have_count(2)
    assert {members.nth(i).get_attribute("data-state") for i in range(2)} == {"Updated"}
    expect(card.locator(".stable")).to_have_text("v2")
    expect(card.locator('button[data-action="promote"]')).to_be_disabled()

    # Pause and resume: spec.paused, as the commands set it.
    card.locator('button[data-action="pause"]').click()
    expect(card.locator('button[data-action="resume"]')).to_be_enabled(timeout=LIVE_S)
    assert rollouts.get(NAME)["spec"]["paused"] is True
    card.locator('button[data-action="resume"]').click()
    expect(card.locator('button[data-action="pause"]')).to_be_enabled(timeout=LIVE_S)
    assert rollouts.get(NAME)["spec"]["paused"] is False

    # v3 pauses after its canary again: v2's promote, still on the CR, names v2.
    rollouts.patch_spec(
        NAME, {"version": "v3", "strategy": {"waves": [1, 2, "100%"], "pauseAfterWave": [0, 1]}}
    )
    expect(card.locator(".version")).to_have_text("v3", timeout=LIVE_S)
    expect(card).to_have_attribute("data-phase", "Paused", timeout=LIVE_S)
    expect(card.locator(".updated")).to_have_text("1/3")
    card.locator('button[data-action="promote"]').click()
    expect(card.locator(".result")).to_have_text(f"{NAME}: promoted past wave 1")
    assert _annotations(rollouts)[PROMOTE_ANNOTATION] == "0@v3"

    # Abort v3 while it waits after its second wave: the abort annotation names the rollout (its
    # start) and the version.
    expect(card.locator('tr[data-wave="2"]')).to_have_attribute("data-phase", "Completed", timeout=LIVE_S)
    expect(card).to_have_attribute("data-phase", "Paused", timeout=LIVE_S)
    expect(card.locator(".updated")).to_have_text("2/3")
    _screenshot(page, tmp_path)
    card.locator('button[data-action="abort"]').click()
    expect(card.locator(".result")).to_contain_text("aborting v3")
    started = rollouts.status(NAME)["startedAt"]
    assert _annotations(rollouts)[ABORT_ANNOTATION] == f"{started}@v3"
    expect(card).to_have_attribute("data-phase", "RolledBack", timeout=LIVE_S)

    # Retry, offered once the rollout ended RolledBack: v3 again, up to the same pause.
    card.locator('button[data-action="retry"]').click()
    expect(card.locator(".result")).to_have_text(f"{NAME}: retrying v3 (was RolledBack; its abort withdrawn)")
    annotations = _annotations(rollouts)
    assert annotations.get(RETRY_ANNOTATION)
    assert ABORT_ANNOTATION not in annotations, "a retry withdraws the abort of its version"
    expect(card).to_have_attribute("data-phase", "Paused", timeout=LIVE_S)

    assert page.evaluate("window.sameDocument") is True, "the page was reloaded"
    assert int(page.locator("body").get_attribute("data-updates")) > 5


def _screenshot(page: Any, tmp_path: Path) -> None:
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000, "a screenshot of a drawn page"
    if os.environ.get("CKPT_SCREENSHOT_DIR"):
        target = Path(os.environ["CKPT_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target / "dashboard.png")


def test_actions_come_only_from_the_page_and_its_host(
    dashboard: str, dashboard_token: str, crd_installed: None, rollouts: Rollouts, namespace: str
) -> None:
    """Another site's page can POST to 127.0.0.1 but not learn the token (the page is served
    without it, and may not be framed); a name rebound to 127.0.0.1 arrives with its own Host
    header. Neither changes the CR."""
    rollouts.create(NAME, rollout_spec("http://127.0.0.1:9/x", "v2", {"app": "nobody"}))
    path = f"/api/rollouts/{namespace}/{NAME}/pause"
    assert _post(dashboard + path, {})[0] == 403
    token = dashboard_token
    with urllib.request.urlopen(dashboard + "/", timeout=10) as resp:
        assert token not in resp.read().decode()
        assert resp.headers["X-Frame-Options"] == "DENY"
    assert _post(dashboard + path, {"X-Dashboard-Token": token, "Host": "evil.example:80"})[0] == 421
    assert not rollouts.get(NAME)["spec"].get("paused"), "refused requests write nothing"

    code, body = _post(dashboard + f"/api/rollouts/{namespace}/{NAME}/promote", {"X-Dashboard-Token": token})
    refused = f"{NAME}: not paused after a wave (phase is unknown); nothing to promote"
    assert (code, body["error"]) == (409, refused)
    code, body = _post(dashboard + f"/api/rollouts/other/{NAME}/pause", {"X-Dashboard-Token": token})
    assert code == 404, body
    code, body = _post(dashboard + f"/api/rollouts/{namespace}/missing/pause", {"X-Dashboard-Token": token})
    assert (code, body["error"]) == (404, f"checkpointrollout {namespace}/missing not found")
    assert _post(dashboard + path, {"X-Dashboard-Token": token}) == (
        200,
        {"message": f"{NAME}: paused (in-flight loads finish; no new calls)"},
    )
    assert rollouts.get(NAME)["spec"]["paused"] is True


def _post(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
