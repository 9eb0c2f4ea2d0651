"""The reference engine: a real paddle model held in-process, loaded through `InProcessLoader`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import paddle

from ckpt_agent.compat import ParamSpec
from ckpt_agent.dtypes import numpy_dtype
from ckpt_agent.engines.base import EngineUnavailable, LoadJob, LoadOutcome
from ckpt_agent.engines.reference_model import build_model, safetensors_dtype
from ckpt_agent.loader import ApplyFn, ApplyMode, InProcessLoader
from ckpt_agent.manifest import TensorEntry
from ckpt_agent.pause_gate import PauseGate
from ckpt_agent.reader import LoadProgress
from ckpt_agent.relay.copy import ReadTensor, RelayGone
from ckpt_agent.synth import ReferenceModelSpec, reference_input


class PaddleEngine:
    name = "paddle"
    supports_infer = True

    def __init__(
        self,
        spec: ReferenceModelSpec,
        *,
        apply_mode: ApplyMode = "staged",
        chunk_bytes: int,
        max_manifest_bytes: int,
        parallelism: int = 1,
        relay: bool = True,
    ) -> None:
        self.spec = spec
        self._model = build_model(spec)
        self._params = dict(self._model.state_dict())
        self._specs = {
            name: ParamSpec(safetensors_dtype(p), tuple(int(d) for d in p.shape))
            for name, p in self._params.items()
        }
        self._input = reference_input(spec.hidden)
        # One lock orders inference against parameter writes: a forward pass sees either the
        # old or the new version, never a mix.
        self._lock = threading.Lock()
        self._paused = False
        self._consistent = True
        # Bumped whenever parameters are written: a relay reader of the live parameters refuses
        # to serve bytes of a version that is no longer (or not yet entirely) live.
        self._generation = 0
        self._loader = InProcessLoader(
            self,
            apply_mode=apply_mode,
            chunk_bytes=chunk_bytes,
            max_manifest_bytes=max_manifest_bytes,
            parallelism=parallelism,
            relay=relay,
        )

    # -- WeightsTarget -------------------------------------------------------------------------
    def parameter_specs(self) -> Mapping[str, ParamSpec]:
        return self._specs

    @contextmanager
    def applying(self) -> Iterator[ApplyFn]:
        with self._lock:
            self._consistent = False
            self._generation += 1
            yield self._apply_tensor
            self._consistent = True

    def live_reader(self) -> ReadTensor:
        generation = self._generation

        def read(entry: TensorEntry) -> memoryview:
            with self._lock:
                if self._generation != generation or not self._consistent:
                    raise RelayGone("the live parameters changed since this version was loaded")
                array = self._params[entry.name].numpy()
            return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data

        return read

    def _apply_tensor(self, entry: TensorEntry, data: memoryview) -> None:
        array = np.frombuffer(data, dtype=numpy_dtype(entry.dtype)).reshape(entry.shape)
        self._params[entry.name].set_value(array)

    # -- Engine --------------------------------------------------------------------------------
    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def _set_paused(self, paused: bool) -> None:
        with self._lock:  # waits for an in-flight forward pass to finish
            self._paused = paused

    async def pause(self) -> None:
        await asyncio.to_thread(self._set_paused, True)

    async def resume(self) -> None:
        await asyncio.to_thread(self._set_paused, False)

    async def is_paused(self) -> bool:
        return self._paused

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        return await self._loader.load(job, gate, progress)

    def _infer(self) -> list[float]:
        if self._paused:
            # Fail fast instead of queueing behind a streamed apply that holds the lock.
            raise EngineUnavailable("the engine is paused")
        with self._lock:
            if self._paused:
                raise EngineUnavailable("the engine is paused")
            if not self._consistent:
                raise EngineUnavailable("the model holds no consistent weights")
            with paddle.no_grad():
                out = self._model(paddle.to_tensor(self._input))
            return [float(v) for v in out.numpy().ravel()]

    async def infer(self) -> list[float]:
        return await asyncio.to_thread(self._infer)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "apply_mode": self._loader.apply_mode,
            "model": {"hidden": self.spec.hidden, "layers": self.spec.layers, "outputs": self.spec.outputs},
            "consistent": self._consistent,
        }
