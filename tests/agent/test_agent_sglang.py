"""The SGLang adapter against a stand-in rebuilt from SGLang 0.5.23's code: staged loads are
paused, loaded with their weight version and confirmed through /model_info; a load that fails
once SGLang may have touched its weights ends with the previous version reloaded and confirmed,
or with WeightsLost and the pod NotReady; misconfigured servers are refused with the fix named."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_testkit import AgentFactory, Tree
from disk_engine_kit import Starter, disk_agent, holds, resumed_only_whole_versions, standins

from ckpt_agent.cli import build_parser, config_from_args
from ckpt_agent.config import AgentConfig, ConfigError
from ckpt_agent.engines.disk_staged import WEIGHTS_LOST_HOLDER, EngineMisconfigured
from ckpt_agent.engines.sglang import PAUSE_MODES
from ckpt_e2e.procs import PortReservation
from ckpt_e2e.standins.sglang import SGLangStandIn


def _updates(sglang: SGLangStandIn) -> list[dict[str, Any]]:
    """The agent's update_weights_from_disk bodies (not its start-up check's empty one)."""
    return [body for name, body in sglang.calls if name == "update_weights_from_disk" and body]


@pytest.fixture
async def start_sglang() -> AsyncIterator[Starter]:
    async with standins(SGLangStandIn) as start:
        yield start


async def test_a_load_is_paused_loaded_with_its_version_confirmed_and_continued(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    probe = list(sglang.calls)
    assert [name for name, _ in probe] == ["model_info", "server_info", "update_weights_from_disk"]
    assert probe[2][1] == {}, "the start-up check sends an update that SGLang's validation refuses"

    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"], status["checksum_verified"]) == ("v2", "idle", True)
    assert sglang.calls[len(probe) :] == [
        ("pause_generation", {"mode": "abort"}),
        (
            "update_weights_from_disk",
            {
                "model_path": str(staging / "v2"),
                "weight_version": "v2",
                "flush_cache": True,
                "keep_pause": True,
            },
        ),
        ("model_info", None),
        ("continue_generation", {}),
    ]
    assert holds(sglang, tree, "v2")
    assert (sglang.weight_version, sglang.paused) == ("v2", None)
    # What SGLang serves under: its model path and served model name are the staged directory.
    assert sglang.model_path == sglang.served_model_name == str(staging / "v2")

    assert (await client.update("v3", verify_checksum=True))[0] == 202
    assert (await client.wait_settled())["version"] == "v3"
    assert holds(sglang, tree, "v3")
    assert sorted(p.name for p in staging.iterdir()) == ["v3"], "the previous staged version is removed"
    assert sglang.resumed_with == [frozenset({str(staging / "v2")}), frozenset({str(staging / "v3")})]


@pytest.mark.parametrize(("mode", "flush"), [("retract", True), ("in_place", False)])
async def test_the_pause_mode_is_configurable(
    mode: str, flush: bool, tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """in_place keeps running requests' KV cache, which SGLang refuses to flush (failing the
    update after swapping weights): the agent does not ask for the flush then."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    client = await disk_agent(
        agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s", sglang_pause_mode=mode
    )
    sglang.running_requests = 2
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert ("pause_generation", {"mode": mode}) in sglang.calls
    (update,) = _updates(sglang)
    assert update["flush_cache"] is flush
    assert holds(sglang, tree, "v2")
    # The scheduler's pause holds until the agent's continue, after the confirm.
    assert (sglang.resumed_by_update, sglang.names[-2:]) == ([], ["model_info", "continue_generation"])


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_a_failed_load_is_restored_before_paused_requests_run(
    mode: str, tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """Requests held by a retract/in_place pause never run on a half-written version: every
    update keeps SGLang's scheduler paused until the agent has restored v2 and resumed."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    client = await disk_agent(
        agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s", sglang_pause_mode=mode
    )
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    sglang.weights.faults.extend([3, None])  # the load fails part way; SGLang's re-read works

    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert all(update.get("keep_pause") for update in _updates(sglang))
    assert sglang.resumed_by_update == []
    assert (holds(sglang, tree, "v2"), sglang.paused) == (True, None)
    assert resumed_only_whole_versions(sglang)


async def test_a_failure_while_loading_restores_the_previous_version(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """SGLang's own rollback re-reads the new path and answers 400 holding v3 while still
    reporting v2: the agent reloads v2 from its staged copy and confirms it before resuming."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    sglang.weights.faults.extend([3, None])  # the load fails part way; SGLang's re-read works

    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert status["last_error"]["reason"] == "EngineError"
    assert "Failed to update weights" in status["last_error"]["message"]
    assert "restored v2" in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is True
    updates = [body["model_path"] for body in _updates(sglang)]
    assert updates[-2:] == [str(staging / "v3"), str(staging / "v2")]
    assert holds(sglang, tree, "v2")
    assert (sglang.weight_version, sglang.model_path) == ("v2", str(staging / "v2"))
    assert resumed_only_whole_versions(sglang)
    assert sorted(p.name for p in staging.iterdir()) == ["v2"]


async def test_a_crash_while_loading_is_weights_lost_until_a_load_succeeds(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """The load fails, SGLang's rollback fails the same way and the server dies: nothing can
    be confirmed, so WeightsLost, NotReady, and the engine is not given traffic back. When
    SGLang comes back (boot weights, unpaused) a successful load pauses it again first."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    sglang.weights.faults.extend([3, 3])

    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, True)
    assert status["report"]["weights_ready"] is False
    assert "restoring v2" in status["last_error"]["message"]
    assert status["paused_by"] == [WEIGHTS_LOST_HOLDER]
    assert sglang.dead

    # A failure that touches nothing does not make the agent forget the weights are unknown.
    sglang.boot()
    assert (await client.update("v404"))[0] == 202
    status = await client.wait_settled()
    assert (status["last_error"]["reason"], status["weights_lost"]) == ("VersionNotFound", True)
    assert status["report"]["weights_ready"] is False

    calls_before = len(sglang.calls)
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("idle", "v3", False)
    assert status["report"]["weights_ready"] is True
    assert status["paused_by"] == []
    assert [n for n, _ in sglang.calls[calls_before:]] == [
        "pause_generation",
        "update_weights_from_disk",
        "model_info",
        "continue_generation",
    ]
    assert holds(sglang, tree, "v3")
    assert sglang.paused is None
    assert resumed_only_whole_versions(sglang)


async def test_a_resume_that_fails_after_a_confirmed_load_is_weights_lost(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """SGLang dies as the agent resumes it: v2 was loaded and confirmed, but nothing serves it,
    so the pod must not be Ready; once SGLang is back, a load pauses it again first."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s")
    sglang.crash_on.add("continue_generation")
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, True)
    assert "v2 loaded and confirmed, but resuming SGLang failed" in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is False

    sglang.crash_on.clear()
    sglang.boot()
    mark = len(sglang.calls)
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == ("v2", False)
    assert sglang.names[mark] == "pause_generation"
    assert (holds(sglang, tree, "v2"), sglang.paused) == (True, None)


async def test_a_first_load_failure_restores_boot_weights_from_a_local_directory(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    boot = str(tree.root / "v1")
    sglang: SGLangStandIn = await start_sglang(boot_path=boot, boot_dir=tree.root / "v1")
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s")
    sglang.weights.faults.extend([2, None])

    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, False)
    assert status["report"]["weights_ready"] is True
    restore = _updates(sglang)[-1]
    assert restore == {
        "model_path": boot,
        "weight_version": "default",
        "flush_cache": True,
        "keep_pause": True,
        "load_format": "auto",
    }
    assert holds(sglang, tree, "v1")
    assert (sglang.model_path, sglang.weight_version) == (boot, "default")
    assert resumed_only_whole_versions(sglang)


async def test_a_first_load_failure_with_hub_boot_weights_is_weights_lost(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """Boot weights named by a hub id would be downloaded again (maybe another revision): not
    restored. The engine stays paused, even against an operator's resume, until a load lands."""
    sglang: SGLangStandIn = await start_sglang(boot_path="Qwen/Qwen3-0.6B", boot_dir=tree.root / "v1")
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s")
    sglang.weights.faults.extend([2, None])

    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, True)
    assert "not a local directory" in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is False
    assert sglang.paused == "abort"
    await client.request("POST", "/v1/pause")
    await client.request("POST", "/v1/resume")
    assert sglang.paused == "abort", "an operator's resume must not give traffic to lost weights"
    assert resumed_only_whole_versions(sglang)

    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"], status["paused_by"]) == ("v2", False, [])
    assert sglang.paused is None
    assert holds(sglang, tree, "v2")


async def test_a_load_refused_before_any_weight_keeps_what_serves(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """The staging directory is not mounted in SGLang's container: SGLang refuses before
    writing a weight ("Failed to get weights iterator"); the agent confirms the previous
    version is still reported and keeps the pod Ready."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    sglang.unmounted = (str(staging),)
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, False)
    assert "Failed to get weights iterator" in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is True
    assert holds(sglang, tree, "v1")

    sglang.unmounted = ()
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    sglang.unmounted = (str(staging),)
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    # The restore of v2 is refused the same way: neither load wrote a weight.
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert holds(sglang, tree, "v2")
    assert sglang.paused is None
    assert resumed_only_whole_versions(sglang)


async def test_a_dummy_weights_server_needs_a_load_format(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    # SGLang reports --load-format in /server_info only; /model_info has none.
    sglang: SGLangStandIn = await start_sglang(load_format="dummy")
    with pytest.raises(EngineMisconfigured, match="--sglang-load-format auto"):
        await disk_agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s")
    assert "pause_generation" not in sglang.names

    client = await disk_agent(
        agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s", sglang_load_format="auto"
    )
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    update = _updates(sglang)[-1]
    assert update["load_format"] == "auto"
    assert (sglang.load_format, holds(sglang, tree, "v2")) == ("auto", True)


@pytest.mark.parametrize(
    ("server", "agent", "normal", "admin"),
    [
        ({"api_key": "k-user", "admin_api_key": "k-admin"}, ("k-user", "k-admin"), "k-user", "k-admin"),
        ({"api_key": "k-user"}, ("k-user", None), "k-user", "k-user"),
        ({"admin_api_key": "k-admin"}, (None, "k-admin"), None, "k-admin"),
    ],
)
async def test_keys_are_sent_as_sglang_checks_them(
    server: dict[str, str],
    agent: tuple[str | None, str | None],
    normal: str | None,
    admin: str | None,
    tree: Tree,
    agent_factory: AgentFactory,
    start_sglang: Starter,
    tmp_path: Path,
) -> None:
    """Admin routes take the admin key when SGLang has one, else the api key; /model_info the
    api key, if any."""
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1", **server)
    files = {}
    for name, key in zip(("sglang_api_key_file", "sglang_admin_api_key_file"), agent, strict=True):
        if key is not None:
            (tmp_path / name).write_text(key + "\n")
            files[name] = tmp_path / name
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s", **files)
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    sent = {(path, header) for path, header in sglang.auth}
    expect_normal = f"Bearer {normal}" if normal else None
    assert sent == {
        ("/model_info", expect_normal),
        ("/server_info", expect_normal),
        ("/update_weights_from_disk", f"Bearer {admin}"),
        ("/pause_generation", f"Bearer {admin}"),
        ("/continue_generation", f"Bearer {admin}"),
    }


@pytest.mark.parametrize(
    ("server", "agent_files", "hint"),
    [
        ({"api_key": "k-user"}, {}, "--sglang-api-key-file"),
        (
            {"api_key": "k-user", "admin_api_key": "k-admin"},
            {"sglang_api_key_file": "k-user"},
            "--sglang-admin-api-key-file",
        ),
        ({"admin_api_key": "k-admin"}, {"sglang_admin_api_key_file": "wrong"}, "--sglang-admin-api-key-file"),
    ],
)
async def test_missing_or_wrong_keys_are_refused_at_start_up(
    server: dict[str, str],
    agent_files: dict[str, str],
    hint: str,
    tree: Tree,
    agent_factory: AgentFactory,
    start_sglang: Starter,
    tmp_path: Path,
) -> None:
    sglang: SGLangStandIn = await start_sglang(**server)
    files = {}
    for name, key in agent_files.items():
        (tmp_path / name).write_text(key)
        files[name] = tmp_path / name
    with pytest.raises(EngineMisconfigured, match=hint):
        await disk_agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s", **files)
    assert "pause_generation" not in sglang.names


async def test_a_key_rotated_under_the_agent_fails_the_load_before_anything_changes(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    sglang: SGLangStandIn = await start_sglang(boot_dir=tree.root / "v1", admin_api_key="k1")
    (tmp_path / "admin").write_text("k1")
    client = await disk_agent(
        agent_factory,
        "sglang",
        sglang.server.url,
        tree,
        tmp_path / "s",
        sglang_admin_api_key_file=tmp_path / "admin",
    )
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    sglang.admin_api_key = "k2"
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert "HTTP 401" in status["last_error"]["message"]
    assert (holds(sglang, tree, "v2"), sglang.paused) == (True, None)


async def test_an_engine_not_up_yet_is_checked_before_the_first_load(
    tree: Tree, agent_factory: AgentFactory, start_sglang: Starter, tmp_path: Path
) -> None:
    """A sidecar engine boots for minutes: the agent starts without it, and checks it before
    pulling anything for the first load (a misconfigured one fails that load, untouched)."""
    held = PortReservation(1)  # the stand-in binds it later; nobody else can meanwhile
    (port,) = held.ports
    url = f"http://127.0.0.1:{port}"
    client = await disk_agent(agent_factory, "sglang", url, tree, tmp_path / "s")
    assert (await client.status())["state"] == "idle"
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["bytes_done"], status["weights_lost"]) == ("failed", 0, False)

    sglang: SGLangStandIn = await start_sglang(port=port, load_format="dummy")
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert "--sglang-load-format auto" in status["last_error"]["message"]
    assert (status["bytes_done"], sglang.names) == (0, ["model_info", "server_info"])
    held.release()


def test_sglang_flags_reach_the_config(tmp_path: Path) -> None:
    key = tmp_path / "admin"
    key.write_text("k-admin\n")

    def config(*flags: str) -> AgentConfig:
        argv = ["agent", "--no-auth", "--plain-http", "--engine", "sglang"]
        argv += ["--staging-dir", str(tmp_path / "s"), *flags]
        parsed: AgentConfig = config_from_args(build_parser().parse_args(argv), {})
        parsed.validate()
        return parsed

    parsed = config("--sglang-admin-api-key-file", str(key), "--sglang-load-format", "auto")
    assert (parsed.sglang_pause_mode, parsed.sglang_admin_api_key_file, parsed.sglang_load_format) == (
        "abort",
        key,
        "auto",
    )
    modes = [config("--sglang-pause-mode", mode).sglang_pause_mode for mode in PAUSE_MODES]
    assert modes == list(PAUSE_MODES)
    with pytest.raises(SystemExit):
        config("--sglang-pause-mode", "keep")
    key.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        parsed.validate()
