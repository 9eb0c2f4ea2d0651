"""Hugging Face-style model directories for tests, written with the safetensors library.

What an RL trainer hands us: a small llama-like model — `config.json`, generation config,
tokenizer files, BF16 weights, FP8 (E4M3) projection weights with block scales (`F8_E8M0`, as
DeepSeek/Qwen FP8 exports carry them, or F32), a tied embedding (no `lm_head.weight`), and
either one `model.safetensors` or shards with `model.safetensors.index.json`.
Bytes are seeded random bits, so two seeds give two versions of the same model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import TensorSpec, serialize_file

from ckpt_source.dtypes import FRAMEWORK_NAMES, nbytes_of

FP8_BLOCK = 32


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass
class HFCheckpoint:
    path: Path
    tensors: dict[str, Tensor] = field(default_factory=dict)
    # Non-weight files, by name: what publish must keep and stage byte for byte.
    extra_files: dict[str, bytes] = field(default_factory=dict)
    shards: dict[str, list[str]] = field(default_factory=dict)  # shard file -> its tensors


def random_bytes(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> bytes:
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == "BOOL":
        return rng.integers(0, 2, count, dtype=np.uint8).tobytes()
    if dtype == "BF16":  # the top half of random float32s: finite, realistic bf16 bits
        floats = rng.standard_normal(count, dtype=np.float32) * 0.02
        return (floats.view(np.uint32) >> 16).astype("<u2").tobytes()
    if dtype in ("F8_E4M3", "F8_E5M2"):  # any bits but the NaN patterns
        bits = rng.integers(0, 256, count, dtype=np.uint8)
        nan_exp = 0x7F if dtype == "F8_E4M3" else 0x7C
        return np.where((bits & 0x7F) >= nan_exp, bits & 0x3F, bits).astype(np.uint8).tobytes()
    if dtype == "F8_E8M0":  # power-of-two scales around 2**-8 (255 is NaN)
        return rng.integers(119, 135, count, dtype=np.uint8).tobytes()
    if dtype == "F4":
        return rng.integers(0, 256, (count + 1) // 2, dtype=np.uint8).tobytes()
    if dtype in ("F16", "F32", "F64"):
        return (
            (rng.standard_normal(count) * 0.02)
            .astype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype])
            .tobytes()
        )
    return rng.integers(0, 256, nbytes_of(dtype, shape), dtype=np.uint8).tobytes()


def write_safetensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """One file through the safetensors library itself (its header, its layout)."""
    keep = {name: np.frombuffer(t.data, dtype=np.uint8).copy() for name, t in tensors.items()}
    specs = {
        name: TensorSpec(
            dtype=FRAMEWORK_NAMES[t.dtype],
            # TensorSpec takes F4's storage shape: two values per byte along the last axis.
            shape=[*t.shape[:-1], t.shape[-1] // 2] if t.dtype == "F4" else list(t.shape),
            data_ptr=keep[name].ctypes.data,
            data_len=keep[name].nbytes,
        )
        for name, t in tensors.items()
    }
    serialize_file(specs, str(path), metadata=metadata)


def llama_like(
    root: Path,
    *,
    seed: int,
    shards: int = 2,
    index: bool = True,
    scale_dtype: str = "F8_E8M0",
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 128,
    weight_dtype: str = "F8_E4M3",
) -> HFCheckpoint:
    """Write a llama-like HF model directory at `root` (created); `scale_dtype` "F32" makes a
    checkpoint every paddle dtype can hold, `weight_dtype` "BF16" one without FP8."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    ckpt = HFCheckpoint(root)
    blocks = -(-hidden // FP8_BLOCK)

    def add(name: str, dtype: str, shape: tuple[int, ...]) -> None:
        ckpt.tensors[name] = Tensor(dtype, shape, random_bytes(rng, dtype, shape))

    add("model.embed_tokens.weight", "BF16", (vocab, hidden))
    for i in range(layers):
        p = f"model.layers.{i}"
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"):
            add(f"{p}.{proj}.weight", weight_dtype, (hidden, hidden))
            if weight_dtype.startswith("F8"):
                add(f"{p}.{proj}.weight_scale_inv", scale_dtype, (blocks, blocks))
        for proj in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            add(f"{p}.{proj}.weight", "BF16", (hidden, hidden))
        add(f"{p}.input_layernorm.weight", "BF16", (hidden,))
        add(f"{p}.post_attention_layernorm.weight", "BF16", (hidden,))
    add("model.norm.weight", "BF16", (hidden,))
    # tie_word_embeddings: HF saves no lm_head.weight; loaders reuse embed_tokens.

    names = list(ckpt.tensors)
    count = max(1, min(shards, len(names)))
    groups = [names[i::count] for i in range(count)]
    if count == 1 and not index:
        ckpt.shards["model.safetensors"] = names
    else:
        for n, group in enumerate(groups):
            ckpt.shards[f"model-{n + 1:05d}-of-{count:05d}.safetensors"] = sorted(group)
    for shard, members in ckpt.shards.items():
        write_safetensors(root / shard, {m: ckpt.tensors[m] for m in members}, {"format": "pt"})

    quant = (
        {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
        if weight_dtype.startswith("F8")
        else None
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": vocab,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        **({"quantization_config": quant} if quant else {}),
    }
    ckpt.extra_files["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
    ckpt.extra_files["generation_config.json"] = (
        b'{"bos_token_id": 1, "eos_token_id": 2, "do_sample": true}\n'
    )
    vocab_map = {f"tok{i}": i for i in range(vocab)}
    ckpt.extra_files["tokenizer.json"] = json.dumps(
        {"version": "1.0", "model": {"type": "WordLevel", "vocab": vocab_map, "unk_token": "tok0"}}
    ).encode()
    ckpt.extra_files["tokenizer_config.json"] = (
        b'{"model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"}\n'
    )
    ckpt.extra_files["special_tokens_map.json"] = b'{"bos_token": "tok1", "eos_token": "tok2"}\n'
    if index:
        weight_map = {m: shard for shard, members in ckpt.shards.items() for m in members}
        total = sum(len(t.data) for t in ckpt.tensors.values())
        ckpt.extra_files["model.safetensors.index.json"] = (
            json.dumps(
                {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2
            )
            + "\n"
        ).encode()
    for name, raw in ckpt.extra_files.items():
        (root / name).write_bytes(raw)
    return ckpt
