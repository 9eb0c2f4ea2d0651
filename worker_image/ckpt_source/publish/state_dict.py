"""A saved paddle state dict (`paddle.save`) written out as safetensors shards.

Tensors keep their raw bits: paddle's numpy export gives bf16 as uint16 and float8 as int8 of the
same bits, which is exactly what a shard stores under the paddle dtype's safetensors name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ckpt_source.dtypes import BY_PADDLE_NAME, from_numpy
from ckpt_source.publish.sources import PublishError
from ckpt_source.safetensors_format import write_file

Array = tuple[str, str, np.ndarray[Any, Any]]


def _arrays(src: Path) -> list[Array]:
    try:
        import paddle
    except ImportError:
        raise PublishError(
            f"{src}: publishing a paddle state dict needs paddle (install ckpt-rollout[paddle])"
        ) from None

    try:
        state = paddle.load(str(src))
    except Exception as exc:  # paddle raises anything from pickle errors to RuntimeError
        detail = " ".join(str(exc).split())[:200]
        raise PublishError(
            f"{src}: neither a *.safetensors file nor a paddle state dict ({type(exc).__name__}: {detail})"
        ) from None
    if not isinstance(state, dict):
        raise PublishError(f"{src}: does not hold a state dict (got {type(state).__name__})")
    arrays: list[Array] = []
    for name, value in state.items():
        if isinstance(value, paddle.Tensor):
            try:
                dtype = BY_PADDLE_NAME[str(value.dtype)]
            except KeyError:
                raise PublishError(
                    f"{src}: tensor {name!r} has dtype {value.dtype}, which safetensors cannot hold"
                ) from None
            arrays.append((str(name), dtype, np.ascontiguousarray(value.numpy())))
        elif isinstance(value, np.ndarray):
            try:
                dtype = from_numpy(value.dtype)
            except ValueError as exc:
                raise PublishError(f"{src}: tensor {name!r}: {exc}") from None
            arrays.append((str(name), dtype, np.ascontiguousarray(value)))
        else:
            raise PublishError(f"{src}: state dict entry {name!r} is a {type(value).__name__}, not a tensor")
    return arrays


def _split(arrays: list[Array], shard_bytes: int) -> list[list[Array]]:
    shards: list[list[Array]] = [[]]
    size = 0
    for item in arrays:
        if shards[-1] and size + item[2].nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item[2].nbytes
    return shards


def write_state_dict(src: Path, out: Path, shard_bytes: int) -> list[str]:
    """Write `src`'s tensors as shards of about `shard_bytes` into `out`; returns their names."""
    shards = _split(_arrays(src), shard_bytes)
    names = []
    for index, shard in enumerate(shards):
        name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        views = [(n, dtype, tuple(a.shape), a.reshape(-1).view(np.uint8).data) for n, dtype, a in shard]
        with (out / name).open("xb") as f:
            write_file(f, views)
        names.append(name)
    return names
