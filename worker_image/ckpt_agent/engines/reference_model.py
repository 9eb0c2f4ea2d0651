"""The paddle reference model (imports paddle: load this module lazily)."""

from __future__ import annotations

from typing import Any

import paddle

from ckpt_agent.synth import ReferenceModelSpec

PADDLE_DTYPES: dict[str, str] = {
    "paddle.float32": "F32",
    "paddle.float16": "F16",
    "paddle.bfloat16": "BF16",
    "paddle.float64": "F64",
    "paddle.int64": "I64",
    "paddle.int32": "I32",
    "paddle.int8": "I8",
    "paddle.uint8": "U8",
    "paddle.bool": "BOOL",
}


class ReferenceMLP(paddle.nn.Layer):  # type: ignore[misc]
    def __init__(self, spec: ReferenceModelSpec) -> None:
        super().__init__()
        self.layers = paddle.nn.LayerList(
            [paddle.nn.Linear(spec.hidden, spec.hidden) for _ in range(spec.layers)]
        )
        self.head = paddle.nn.Linear(spec.hidden, spec.outputs)

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = paddle.tanh(layer(x))
        return self.head(x)


def build_model(spec: ReferenceModelSpec) -> ReferenceMLP:
    model = ReferenceMLP(spec)
    model.eval()
    return model


def safetensors_dtype(tensor: Any) -> str:
    return PADDLE_DTYPES[str(tensor.dtype)]
