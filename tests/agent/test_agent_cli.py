"""The CLI hooks, and the agent and source as real processes."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import aiohttp
import pytest
from agent_testkit import SPEC, AgentClient, Tree, ckpt_agent_process, close_to, wait_until

from ckpt_agent.cli import add_commands, config_from_args
from ckpt_e2e.bench.cli import build_parser as bench_parser
from ckpt_e2e.bench.dataplane import run_dataplane


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt-rollout")
    sub = parser.add_subparsers(dest="command")
    add_commands(sub)
    return parser


def test_commands_register_on_a_host_parser() -> None:
    parser = _parser()
    for argv in (
        ["publish", "src", "--version", "v", "--out", "root"],
        ["serve", "root"],
        ["agent", "--no-auth"],
    ):
        assert callable(parser.parse_args(argv).func)


def test_benches_have_their_own_parser() -> None:
    """`python -m ckpt_e2e.bench`, not a group of the product's `ckpt-rollout`."""
    args = bench_parser().parse_args(["dataplane", "--size-mb", "8", "--json"])
    assert callable(args.func)
    assert (args.size_mb, args.json) == (8, True)
    assert bench_parser().prog == "python -m ckpt_e2e.bench"


def test_agent_flags_and_pod_identity_from_the_environment() -> None:
    args = _parser().parse_args(
        [
            "agent",
            "--engine",
            "paddle",
            "--source",
            "file:///ckpt",
            "--initial-version",
            "v1",
            "--tokenreview-audience",
            "aud",
            "--allowed-usernames",
            "system:serviceaccount:a:b, system:serviceaccount:c:d",
            "--apply-mode",
            "streamed",
            "--no-report",
            "--plain-http",
            "--model-hidden",
            "128",
        ]
    )
    env = {"POD_NAME": "w-0", "POD_NAMESPACE": "rl", "POD_IP": "127.0.0.42"}
    config = config_from_args(args, env)
    config.validate()
    assert (config.host, config.port) == ("127.0.0.42", 8089)
    assert (config.pod_name, config.pod_namespace, config.report) == ("w-0", "rl", False)
    assert config.auth.allowed_usernames == ("system:serviceaccount:a:b", "system:serviceaccount:c:d")
    assert (config.apply_mode, config.model.hidden) == ("streamed", 128)
    assert config_from_args(_parser().parse_args(["agent", "--no-auth"]), {}).host == "127.0.0.1"


def test_agent_refuses_to_start_without_an_auth_choice(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["agent"])
    assert args.func(args) == 2
    assert "--no-auth" in capsys.readouterr().err


async def test_agent_and_source_as_real_processes(tree: Tree, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken")
    async with (
        ckpt_agent_process("serve", str(tree.root), "--port", "0") as (source, source_url),
        ckpt_agent_process(
            "agent", "--port", "0", "--metrics-port", "0", "--source", source_url, "--initial-version", "v1",
            "--auth-token-file", str(token), "--plain-http", "--no-report", "--apply-mode", "streamed",
            "--model-hidden", str(SPEC.hidden), "--model-layers", str(SPEC.layers),
        ) as (agent, agent_url),
        aiohttp.ClientSession() as session,
    ):  # fmt: skip
        client = AgentClient(session, agent_url, "t0ken")

        async def at(version: str) -> bool:
            status = await client.status()
            return status["state"] == "idle" and status["version"] == version

        await wait_until(lambda: at("v1"), 60, "the initial version")
        assert close_to(await client.infer(), tree.expected("v1"))
        assert (await client.update("v2", verify_checksum=True))[0] == 202
        await wait_until(lambda: at("v2"), 60, "v2")
        assert close_to(await client.infer(), tree.expected("v2"))

        for proc in (agent, source):
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0


@pytest.mark.bench
def test_bench_dataplane_reports_every_figure(tmp_path: Path) -> None:
    results = run_dataplane(size_mb=4, tensor_mb=1, chunk_mb=1, repeat=1, workdir=str(tmp_path))
    for key in (
        "memcpy_gbps", "xxh3_gbps", "digests_gbps", "tcp_gbps", "file_gbps", "file_verify_gbps", "http_gbps",
        "http_verify_gbps", "publish_gbps", "file_verify_finite_gbps", "http_verify_finite_gbps",
    ):  # fmt: skip
        assert results[key] > 0, key
    assert set(results["finite_check_gbps"]) == {"BF16", "F32"}
    assert all(gbps > 0 for gbps in results["finite_check_gbps"].values())
    for key in ("mooncake_gbps", "mooncake_verify_gbps"):  # the engine is installed here (agent extra)
        assert results[key] > 0, key
    assert results["peak_extra_rss_mb"] >= 0
    # The Mooncake path reads through a registered bounce buffer: its budget counts it.
    assert results["mooncake_peak_extra_rss_mb"] >= 0
    assert results["mooncake_rss_budget_mb"] == results["rss_budget_mb"] + 32
    assert set(results["targets_met"]) == {
        "http_ge_half_tcp", "mooncake_verify_ge_half_tcp", "file_ge_half_memcpy", "verify_cost_le_10pct",
        "rss_within_budget", "publish_ge_0_8_xxh3", "publish_ge_0_8_digests", "finite_cost_le_10pct",
    }  # fmt: skip
