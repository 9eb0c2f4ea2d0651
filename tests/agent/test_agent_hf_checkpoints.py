"""Real checkpoints through the agent: Hugging Face model directories written with the
safetensors library (a small llama-like model: BF16, FP8 E4M3 weights with F8_E8M0 or F32 block
scales, a tied embedding, two shards and an index, config and tokenizer files).

The disk engines get a staged directory that is the model directory, refused before their
server is called when it would not load. The paddle engine boots a model shaped like such a
checkpoint and applies later versions byte for byte, in every dtype paddle holds; a version in
a dtype it lacks is refused naming the tensor and the dtype, the old weights still serving."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, set_extra_files
from disk_engine_kit import StandIn, disk_agent, standins
from vllm_standin import VLLMStandIn

from ckpt_agent.agent import build_agent
from ckpt_agent.cli import build_parser, config_from_args
from ckpt_agent.config import AgentConfig, AuthConfig, ConfigError, TLSConfig
from ckpt_agent.engines.boot_checkpoint import BootCheckpointError
from ckpt_agent.engines.paddle_tensors import read_bytes, supported_dtypes, tensor_from_bytes
from ckpt_api.manifest import TensorRecord
from ckpt_e2e.hf_checkpoint import HFCheckpoint, Tensor, llama_like, write_safetensors
from ckpt_e2e.standins.sglang import SGLangStandIn
from ckpt_source.dtypes import nbytes_of
from ckpt_source.safetensors_format import write_file

INDEX = "model.safetensors.index.json"
STANDINS: dict[str, Any] = {"sglang": SGLangStandIn, "vllm": VLLMStandIn}
# What paddle 3.3.1 holds (it names uint16/32/64 but has no kernels for them).
PADDLE_HOLDS = {
    "BOOL",
    "U8",
    "I8",
    "I16",
    "I32",
    "I64",
    "F16",
    "BF16",
    "F32",
    "F64",
    "C64",
    "F8_E4M3",
    "F8_E5M2",
}
PADDLE_LACKS = ["U16", "U32", "U64", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2"]
WEIGHT_CALLS = ("pause", "pause_generation", "collective_rpc", "update_weights_from_disk")


def publish_hf(tree: Tree, version: str, ckpt: HFCheckpoint) -> Path:
    """`ckpt-rollout publish` of an HF directory: every non-weight file is in the version."""
    path = tree.add_from_dir(version, ckpt.path)
    assert set(tree.manifest(version)["extra_files"]) == set(ckpt.extra_files)
    return path


def entries(tree: Tree, version: str) -> list[TensorRecord]:
    return [TensorRecord.model_validate(t, strict=False) for t in tree.manifest(version)["tensors"]]


def live_bytes(client: AgentClient, tree: Tree, version: str) -> dict[str, bytes]:
    """Every parameter of the agent's paddle engine, read back from paddle as bytes."""
    read = client.agent.service.engine.live_reader()
    return {e.name: bytes(read(e)) for e in entries(tree, version)}


def raw(tensors: dict[str, Tensor]) -> dict[str, bytes]:
    return {name: t.data for name, t in tensors.items()}


@pytest.fixture
def hf(tmp_path: Path) -> Tree:
    """v1, v2: the llama-like model with F8_E8M0 scales, two shards and an index."""
    tree = Tree(tmp_path / "root", tmp_path / "work")
    for version, seed in (("v1", 1), ("v2", 2)):
        publish_hf(tree, version, llama_like(tmp_path / f"hf-{version}", seed=seed))
    return tree


# -- disk engines ------------------------------------------------------------------------------
@pytest.fixture(params=sorted(STANDINS))
async def engine(request: pytest.FixtureRequest, hf: Tree) -> AsyncIterator[tuple[str, StandIn]]:
    """(engine name, a stand-in booted from v1 that refuses what it could not boot from)."""
    name = str(request.param)
    async with standins(STANDINS[name]) as start:
        yield name, await start(boot_path=str(hf.root / "v1"), boot_dir=hf.root / "v1", model_dir=True)


def _weight_calls(standin: StandIn, since: int) -> list[str]:
    return [n for n in standin.names[since:] if n in WEIGHT_CALLS]


async def test_the_staged_directory_is_the_model_directory(
    hf: Tree, agent_factory: AgentFactory, engine: tuple[str, StandIn], tmp_path: Path
) -> None:
    name, standin = engine
    ckpt = llama_like(tmp_path / "again-v2", seed=2)  # the same bytes publish saw for v2
    client = await disk_agent(agent_factory, name, standin.server.url, hf, tmp_path / "staging")
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2", status["last_error"]

    staged = client.agent.service.engine.staged_path()
    assert staged == tmp_path / "staging" / "v2"
    for file, content in ckpt.extra_files.items():
        assert (staged / file).read_bytes() == content, file
    assert sorted(p.name for p in staged.glob("*.safetensors")) == sorted(ckpt.shards)
    # The engine loaded every tensor, each byte as the trainer wrote it, from the staged copy.
    held = {n: v.tobytes() for n, v in standin.weights.values().items()}
    assert held == raw(ckpt.tensors)
    assert standin.weights.sources() == {str(staged)}


def _break(index: dict[str, Any], how: str) -> bytes:
    weight_map: dict[str, str] = index["weight_map"]
    first, second = sorted(set(weight_map.values()))
    moved = next(t for t, s in sorted(weight_map.items()) if s == first)
    if how == "names a missing shard":
        weight_map[moved] = "model-00003-of-00003.safetensors"
    elif how == "maps a tensor to the wrong shard":
        weight_map[moved] = second
    elif how == "leaves a shard out":
        index["weight_map"] = {t: s for t, s in weight_map.items() if s == first}
    return json.dumps(index).encode()


@pytest.mark.parametrize(
    ("file", "how"),
    [
        (INDEX, "names a missing shard"),
        (INDEX, "maps a tensor to the wrong shard"),
        (INDEX, "leaves a shard out"),
        (INDEX, "is not JSON"),
        ("config.json", "is not JSON"),
    ],
)
async def test_a_version_that_would_not_load_is_refused_before_the_engine_is_called(
    hf: Tree, agent_factory: AgentFactory, engine: tuple[str, StandIn], tmp_path: Path, file: str, how: str
) -> None:
    name, standin = engine
    broken = hf.copy_version("v2", "v2-broken")
    content = (
        b'{"weight_map": ' if how == "is not JSON" else _break(json.loads((broken / file).read_bytes()), how)
    )
    set_extra_files(broken, {file: content})
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, name, standin.server.url, hf, staging)
    assert (await client.update("v1"))[0] == 202
    assert (await client.wait_settled())["version"] == "v1"
    since = len(standin.names)

    assert (await client.update("v2-broken", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == ("v1", False)
    assert status["last_error"]["reason"] == "IncompatibleCheckpoint"
    assert file in status["last_error"]["message"]
    assert _weight_calls(standin, since) == [], "the engine is not called for a directory it cannot load"
    assert sorted(p.name for p in staging.iterdir()) == ["v1"]
    assert standin.weights.sources() == {str(staging / "v1")}


@pytest.mark.parametrize("dropped", ["config.json", INDEX])
async def test_the_stand_ins_refuse_a_directory_without_config_or_index(
    hf: Tree, agent_factory: AgentFactory, engine: tuple[str, StandIn], tmp_path: Path, dropped: str
) -> None:
    """What makes the tests above meaningful: a staged directory that lost its config or its
    index would fail in the stand-ins as at an engine's boot. (The agent itself takes such a
    version as weights only: the engines' in-place loads keep the config they booted with.)"""
    name, standin = engine
    hf.copy_version("v2", "v2-bare")
    set_extra_files(hf.root / "v2-bare", {dropped: None})
    client = await disk_agent(agent_factory, name, standin.server.url, hf, tmp_path / "staging")
    assert (await client.update("v2-bare"))[0] == 202
    status = await client.wait_settled()
    assert status["version"] is None  # still the boot weights, restored from the boot directory
    assert status["last_error"]["reason"] == "EngineError"
    assert dropped in status["last_error"]["message"]
    assert standin.weights.sources() == {str(hf.root / "v1")}


# -- the paddle engine -------------------------------------------------------------------------
async def _paddle(agent_factory: AgentFactory, tree: Tree, boot: Path, **overrides: Any) -> AgentClient:
    client = await agent_factory(source=tree.file_uri, paddle_weights=boot, **overrides)
    status = await client.status()
    assert (status["version"], status["engine"]["model"]["checkpoint"]) == (None, str(boot))
    return client


@pytest.mark.parametrize("boot_from", ["hf directory", "published version", "single file"])
@pytest.mark.parametrize("apply_mode", ["staged", "streamed"])
async def test_paddle_boots_from_a_real_checkpoint_and_applies_the_next_version_byte_exact(
    agent_factory: AgentFactory, tmp_path: Path, boot_from: str, apply_mode: str
) -> None:
    tree = Tree(tmp_path / "root", tmp_path / "work")
    single = boot_from == "single file"  # one model.safetensors, no index
    layout: dict[str, Any] = {"shards": 1, "index": False} if single else {}
    boot_ckpt = llama_like(tmp_path / "hf-1", seed=1, scale_dtype="F32", **layout)
    next_ckpt = llama_like(tmp_path / "hf-2", seed=2, scale_dtype="F32", **layout)
    publish_hf(tree, "s1", boot_ckpt)
    publish_hf(tree, "s2", next_ckpt)
    boot = {
        "hf directory": boot_ckpt.path,
        "published version": tree.root / "s1",
        "single file": boot_ckpt.path / "model.safetensors",
    }[boot_from]

    client = await _paddle(agent_factory, tree, boot, apply_mode=apply_mode)
    assert live_bytes(client, tree, "s1") == raw(boot_ckpt.tensors)
    assert (await client.update("s2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "s2", status["last_error"]
    assert live_bytes(client, tree, "s2") == raw(next_ckpt.tensors)
    # No forward pass for an architecture the agent does not know: said plainly.
    code, body = await client.request("POST", "/v1/infer", {})
    assert (code, body["error"]) == (404, "NotSupported")


async def test_a_version_with_a_dtype_paddle_lacks_is_refused_and_the_old_weights_keep_serving(
    agent_factory: AgentFactory, tmp_path: Path
) -> None:
    tree = Tree(tmp_path / "root", tmp_path / "work")
    boot_ckpt = llama_like(tmp_path / "hf-1", seed=1, scale_dtype="F32")
    publish_hf(tree, "s1", boot_ckpt)
    publish_hf(tree, "e8m0", llama_like(tmp_path / "hf-2", seed=2))  # same names, F8_E8M0 scales
    client = await _paddle(agent_factory, tree, boot_ckpt.path)

    assert (await client.update("e8m0"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_error"]["reason"]) == (None, "IncompatibleCheckpoint")
    assert "'model.layers.0.self_attn.k_proj.weight_scale_inv' is F8_E8M0" in status["last_error"]["message"]
    assert live_bytes(client, tree, "s1") == raw(boot_ckpt.tensors)


async def test_a_boot_checkpoint_with_a_dtype_paddle_lacks_is_refused_at_start(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=1)  # F8_E8M0 block scales
    config = AgentConfig(
        port=0,
        metrics_port=None,
        auth=AuthConfig(disabled=True),
        tls=TLSConfig(plain_http=True),
        paddle_weights=ckpt.path,
    )
    with pytest.raises(
        BootCheckpointError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight_scale_inv' is F8_E8M0"
    ):
        await build_agent(config)


def test_the_agent_command_says_why_it_refuses_boot_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=1)
    args = build_parser().parse_args(
        [
            "agent",
            "--no-auth",
            "--plain-http",
            "--no-report",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--paddle-weights",
            str(ckpt.path),
        ]
    )
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "ckpt-rollout agent:" in err
    assert "is F8_E8M0" in err


# -- every dtype --------------------------------------------------------------------------------
def dtype_tensors(seed: int, dtypes: list[str]) -> dict[str, Tensor]:
    """Per dtype a matrix, a scalar and an empty tensor of random bits (any bit pattern, NaN
    payloads included: paddle must keep bytes, not values)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for dtype in dtypes:
        for kind, shape in (("matrix", (3, 8)), ("scalar", ()), ("empty", (0, 4))):
            nbytes = nbytes_of(dtype, shape)
            data = rng.integers(0, 2 if dtype == "BOOL" else 256, nbytes, dtype=np.uint8).tobytes()
            tensors[f"{dtype.lower()}.{kind}"] = Tensor(dtype, shape, data)
    return tensors


def test_paddle_holds_the_dtypes_it_has_byte_for_byte() -> None:
    assert supported_dtypes() == PADDLE_HOLDS
    for name, t in dtype_tensors(3, sorted(PADDLE_HOLDS)).items():
        assert bytes(read_bytes(tensor_from_bytes(t.dtype, t.shape, t.data))) == t.data, name


async def test_every_dtype_paddle_holds_round_trips_byte_identical(
    agent_factory: AgentFactory, tmp_path: Path
) -> None:
    tree = Tree(tmp_path / "root", tmp_path / "work")
    boot, update = dtype_tensors(1, sorted(PADDLE_HOLDS)), dtype_tensors(2, sorted(PADDLE_HOLDS))
    for version, tensors in (("d1", boot), ("d2", update)):
        (tmp_path / version).mkdir()
        write_safetensors(tmp_path / version / "model.safetensors", tensors)  # the library's writer
        tree.add_from_dir(version, tmp_path / version)

    client = await _paddle(agent_factory, tree, tmp_path / "d1")
    assert sorted(client.agent.service.engine.describe()["model"]["dtypes"]) == sorted(PADDLE_HOLDS)
    assert live_bytes(client, tree, "d1") == raw(boot)
    assert (await client.update("d2", verify_checksum=True))[0] == 202
    assert (await client.wait_settled())["version"] == "d2"
    assert live_bytes(client, tree, "d2") == raw(update)


@pytest.mark.parametrize("dtype", PADDLE_LACKS)
async def test_every_dtype_paddle_lacks_is_refused_naming_tensor_and_dtype(
    agent_factory: AgentFactory, tmp_path: Path, dtype: str
) -> None:
    tree = Tree(tmp_path / "root", tmp_path / "work")
    boot = dtype_tensors(1, ["F32", "BF16"])
    for version, seed in (("d1", 1), ("d2", 2)):
        (tmp_path / version).mkdir()
        write_safetensors(tmp_path / version / "model.safetensors", dtype_tensors(seed, ["F32", "BF16"]))
    odd = Tensor(dtype, (3, 8), bytes(nbytes_of(dtype, (3, 8))))
    with (tmp_path / "d2" / "odd.safetensors").open("wb") as f:  # our encoder: the library has no F6 writer
        write_file(f, [("odd.weight", odd.dtype, odd.shape, memoryview(odd.data))])
    for version in ("d1", "d2"):
        tree.add_from_dir(version, tmp_path / version)
    client = await _paddle(agent_factory, tree, tmp_path / "d1")

    assert (await client.update("d2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_error"]["reason"]) == (None, "IncompatibleCheckpoint")
    assert f"dtypes the engine cannot hold: 'odd.weight' is {dtype}" in status["last_error"]["message"]
    assert live_bytes(client, tree, "d1") == raw(boot)


def test_paddle_weights_is_a_paddle_engine_flag(tmp_path: Path) -> None:
    ckpt = llama_like(tmp_path / "hf", seed=1, scale_dtype="F32")
    argv = ["agent", "--no-auth", "--plain-http", "--paddle-weights", str(ckpt.path)]
    args = build_parser().parse_args(argv)
    assert config_from_args(args, {}).paddle_weights == ckpt.path
    for argv, message in (
        (
            ["--engine", "vllm", "--staging-dir", str(tmp_path), "--paddle-weights", str(ckpt.path)],
            "paddle engine",
        ),
        (["--paddle-weights", str(tmp_path / "absent")], "does not exist"),
    ):
        args = build_parser().parse_args(["agent", "--no-auth", "--plain-http", *argv])
        config = config_from_args(args, {})
        with pytest.raises(ConfigError, match=message):
            config.validate()
