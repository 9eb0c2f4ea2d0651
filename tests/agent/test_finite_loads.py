"""`checks: {"finite": true}` through real agents and real paddle tensors: a version whose
weights hold NaN/Inf (with valid checksums) is refused before anything is applied, naming the
tensor, its dtype and the element, and the old weights keep serving; without the check the same
version loads. Disk engines get the check on the bytes they stage; FastDeploy, which pulls by
itself, refuses the check rather than skipping it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_testkit import SPEC, AgentClient, AgentFactory, Tree, close_to
from disk_engine_kit import disk_agent, holds, standins
from fastdeploy_standin import FastDeployStandIn

from ckpt_agent.formats.synth import write_reference_checkpoint
from ckpt_agent.pipeline.pause_gate import LOAD
from ckpt_api.manifest import TensorRecord
from ckpt_e2e.hf_checkpoint import HFCheckpoint, Tensor, llama_like, write_safetensors
from ckpt_e2e.standins.sglang import SGLangStandIn
from ckpt_source.dtypes import ITEM_SIZES

FINITE = {"checks": {"finite": True}}
POISONED = "layers.1.weight"  # synth's poison: NaN at the middle element
POISONED_AT = SPEC.hidden * SPEC.hidden // 2


@pytest.fixture(params=["staged", "streamed"])
def apply_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def nan_tree(scratch_tree: Tree) -> Tree:
    """v1, v2 and `nan`: v3's shape with a NaN in an F32 weight, published (checksums valid)."""
    src = scratch_tree.work / "src-nan"
    write_reference_checkpoint(src, 4, SPEC, poison=POISONED)
    scratch_tree.add_from_dir("nan", src)
    return scratch_tree


async def _refused(client: AgentClient, version: str, **body: Any) -> dict[str, Any]:
    code, reply = await client.update(version, **body)
    assert code == 202, reply
    status = await client.wait_settled()
    assert status["state"] == "failed", status
    assert status["last_error"]["reason"] == "NonFiniteTensor", status["last_error"]
    assert status["weights_lost"] is False
    assert await client.is_paused() is False
    return status


async def test_a_nan_version_is_refused_before_apply_and_loads_without_the_check(
    agent_factory: AgentFactory, nan_tree: Tree, apply_mode: str
) -> None:
    client = await agent_factory(source=nan_tree.file_uri, initial_version="v1", apply_mode=apply_mode)
    assert (await client.wait_settled())["version"] == "v1"
    before = await client.infer()
    assert close_to(before, nan_tree.expected("v1"))

    status = await _refused(client, "nan", verify_checksum=True, **FINITE)
    assert status["last_error"]["message"] == f"tensor {POISONED!r} (F32) holds NaN at element {POISONED_AT}"
    assert status["version"] == "v1"
    assert await client.infer() == before
    if apply_mode == "staged":
        # Refused while pulling: the engine was never even paused for it.
        assert LOAD not in client.agent.service.gate.held_seconds
    assert (
        await client.metric("ckpt_agent_loads_total", {"result": "failed", "reason": "NonFiniteTensor"}) == 1
    )

    # The check is what refused it: its checksums are fine, and it loads (NaN and all) without.
    assert (await client.update("nan", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["checksum_verified"]) == ("nan", True), status["last_error"]


async def test_a_finite_version_loads_with_the_check(agent_factory: AgentFactory, nan_tree: Tree) -> None:
    client = await agent_factory(source=nan_tree.file_uri, initial_version="v1")
    assert (await client.wait_settled())["version"] == "v1"
    assert (await client.update("v2", **FINITE))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert close_to(await client.infer(), nan_tree.expected("v2"))


async def test_bytes_from_a_peer_are_checked_too(
    agent_factory: AgentFactory, nan_tree: Tree, source_server: Any
) -> None:
    """A relaying peer serves the version as verified (NaN included): the receiver refuses it
    by the check, without falling back to the source (the source holds the same NaN)."""
    url = await source_server(nan_tree.root)
    peer = await agent_factory(source=url, initial_version="nan")
    assert (await peer.wait_settled())["version"] == "nan"
    client = await agent_factory(source=url, initial_version="v1")
    assert (await client.wait_settled())["version"] == "v1"
    status = await _refused(client, "nan", source={"uri": url, "peer": peer.url}, **FINITE)
    assert status["version"] == "v1"
    assert (status["last_load"]["peer"], status["last_load"]["fallback_reason"]) == (peer.url, None)
    assert await client.metric("ckpt_agent_pulled_bytes_total", {"origin": "peer"}) > 0


def _poison(ckpt: HFCheckpoint, tensor: str, index: int, bits: int) -> None:
    """Set element `index` of `tensor` to the raw `bits` and rewrite its shard, as a diverged
    trainer would have saved it."""
    old = ckpt.tensors[tensor]
    width = ITEM_SIZES[old.dtype]
    data = bytearray(old.data)
    data[index * width : (index + 1) * width] = bits.to_bytes(width, "little")
    ckpt.tensors[tensor] = Tensor(old.dtype, old.shape, bytes(data))
    shard = next(s for s, members in ckpt.shards.items() if tensor in members)
    write_safetensors(ckpt.path / shard, {m: ckpt.tensors[m] for m in ckpt.shards[shard]}, {"format": "pt"})


# (tensor of the llama-like model, its dtype, element, bits, what the agent names it)
BAD_ELEMENTS = [
    ("model.layers.1.mlp.down_proj.weight", "BF16", 1234, 0x7FC0, "NaN"),
    ("model.embed_tokens.weight", "BF16", 8191, 0xFF80, "-Inf"),
    ("model.layers.0.self_attn.q_proj.weight", "F8_E4M3", 0, 0xFF, "NaN"),
]


@pytest.mark.parametrize(("tensor", "dtype", "index", "bits", "kind"), BAD_ELEMENTS)
async def test_bf16_and_fp8_checked_on_their_bits_in_paddle(
    agent_factory: AgentFactory,
    tmp_path: Path,
    tensor: str,
    dtype: str,
    index: int,
    bits: int,
    kind: str,
) -> None:
    tree = Tree(tmp_path / "root", tmp_path / "work")
    boot = llama_like(tmp_path / "hf-1", seed=1, scale_dtype="F32")
    bad = llama_like(tmp_path / "hf-2", seed=2, scale_dtype="F32")
    assert bad.tensors[tensor].dtype == dtype
    _poison(bad, tensor, index, bits)
    tree.add_from_dir("bad", bad.path)
    # Staged: boot weights have no source to restore from, so a streamed apply that fails part
    # way (for this reason or any other) would lose them.
    client = await agent_factory(source=tree.file_uri, paddle_weights=boot.path, apply_mode="staged")
    read = client.agent.service.engine.live_reader()
    assert (await client.status())["engine"]["model"]["checkpoint"] == str(boot.path)

    status = await _refused(client, "bad", **FINITE)
    assert status["last_error"]["message"] == f"tensor {tensor!r} ({dtype}) holds {kind} at element {index}"
    assert status["version"] is None  # still the boot weights
    held = {name: bytes(read(_entry(tree, name))) for name in boot.tensors}
    assert held == {name: t.data for name, t in boot.tensors.items()}


def _entry(tree: Tree, name: str) -> TensorRecord:
    t = next(t for t in tree.manifest("bad")["tensors"] if t["name"] == name)
    return TensorRecord.model_validate(t, strict=False)


async def test_a_disk_engine_is_never_asked_to_load_a_nan_version(
    agent_factory: AgentFactory, nan_tree: Tree, tmp_path: Path
) -> None:
    """SGLang/vLLM get the bytes the agent staged: checked there, before the engine is called."""
    async with standins(SGLangStandIn) as start:
        standin = await start(boot_path=str(nan_tree.root / "v1"), boot_dir=nan_tree.root / "v1")
        client = await disk_agent(agent_factory, "sglang", standin.server.url, nan_tree, tmp_path / "staging")
        calls = len(standin.names)
        await _refused(client, "nan", **FINITE)
        assert "update_weights_from_disk" not in standin.names[calls:]
        assert holds(standin, nan_tree, "v1")
        assert not (tmp_path / "staging" / "nan").exists()


async def test_fastdeploy_refuses_the_check_it_cannot_run(
    agent_factory: AgentFactory, nan_tree: Tree
) -> None:
    async with standins(FastDeployStandIn) as start:
        standin = await start()
        client = await agent_factory(
            engine="fastdeploy", engine_url=standin.server.url, source=nan_tree.file_uri
        )
        calls = len(standin.names)
        code, reply = await client.update("v2", **FINITE)
        assert code == 202, reply
        status = await client.wait_settled()
        assert status["last_error"]["reason"] == "EngineError"
        assert "checks.finite cannot run with the fastdeploy engine" in status["last_error"]["message"]
        assert standin.names[calls:] == []  # not even paused
