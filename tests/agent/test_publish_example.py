"""`ckpt-rollout publish --example SEED`: a first checkpoint that fits the paddle reference engine
without reading its code. An agent built from the agent command's own defaults (what
examples/worker-deployment.yaml runs) loads it, its smoke check passes against the reference the
publisher wrote, and /v1/infer answers what those weights compute."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_testkit import AgentFactory, close_to

from ckpt_agent.cli import build_parser
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.formats.synth import ReferenceModelSpec, expected_infer_output
from ckpt_api.manifest import MANIFEST_NAME

CHECK = {"prompt": "x", "max_tokens": 1, "timeout_seconds": 5}


def _run(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    return int(args.func(args))


async def test_an_example_checkpoint_loads_into_an_agent_with_default_flags(
    tmp_path: Path, agent_factory: AgentFactory
) -> None:
    root = tmp_path / "root"
    assert _run("publish", "--example", "7", "--version", "global_step_1200", "--out", str(root)) == 0
    manifest = parse_manifest((root / "global_step_1200" / MANIFEST_NAME).read_bytes())
    assert manifest.reference is not None  # the smoke check has something to compare with

    agent = build_parser().parse_args(["agent"])
    shape = ReferenceModelSpec(agent.model_hidden, agent.model_layers, agent.model_outputs)
    client = await agent_factory(source=root.as_uri(), model=shape)
    assert (await client.update("global_step_1200", verify_checksum=True, health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"]) == ("global_step_1200", "idle"), status
    assert status["last_load"]["health_check"]["passed"] is True, status["last_load"]
    assert close_to(await client.infer(), expected_infer_output(root / "global_step_1200"))


def test_another_seed_is_another_checkpoint_and_the_shape_follows_the_flags(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _run("publish", "--example", "1", "--version", "a", "--out", str(root)) == 0
    assert _run("publish", "--example", "2", "--version", "b", "--out", str(root)) == 0
    small = ["--model-hidden", "8", "--model-layers", "3", "--model-outputs", "2"]
    assert _run("publish", "--example", "1", *small, "--version", "c", "--out", str(root)) == 0
    tensors = {v: parse_manifest((root / v / MANIFEST_NAME).read_bytes()).tensors for v in "abc"}
    assert [t.strong_digest for t in tensors["a"]] != [t.strong_digest for t in tensors["b"]]
    assert {t.name: tuple(t.shape) for t in tensors["c"]} == ReferenceModelSpec(8, 3, 2).parameter_shapes()


@pytest.mark.parametrize("argv", [[], ["somewhere", "--example", "1"]])
def test_it_takes_a_source_or_an_example_not_both(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("publish", *argv, "--version", "v", "--out", str(tmp_path / "root")) == 2
    assert "give SRC or --example SEED" in capsys.readouterr().err
    assert not (tmp_path / "root").exists()
