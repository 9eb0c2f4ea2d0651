"""The paddle reference model (imports paddle: load this module lazily)."""

from __future__ import annotations

from typing import Any

import paddle

from ckpt_agent.formats.synth import ReferenceModelSpec


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
