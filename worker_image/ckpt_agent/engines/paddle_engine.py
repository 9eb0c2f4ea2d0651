"""The paddle engine: real paddle tensors held in-process, loaded through `InProcessLoader`.

It holds either the reference MLP (default; `/v1/infer` runs it) or, with `boot_weights`
(`--paddle-weights`), a model shaped like a real checkpoint: one paddle tensor per checkpoint
tensor, with its name, dtype, shape and bytes. Such a model has no forward pass here (its
architecture is the serving framework's business), so it answers no `/v1/infer`; loads into it
are what they are for any model: checked name/dtype/shape against it, applied byte-exact.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paddle

from ckpt_agent.engines.base import EngineUnavailable, LoadJob, LoadOutcome
from ckpt_agent.engines.boot_checkpoint import BootCheckpointError, boot_tensors
from ckpt_agent.engines.paddle_tensors import (
    read_bytes,
    safetensors_dtype,
    supported_dtypes,
    tensor_from_bytes,
    write_bytes,
)
from ckpt_agent.engines.reference_model import build_model
from ckpt_agent.formats.synth import ReferenceModelSpec, reference_input
from ckpt_agent.pipeline.compat import ParamSpec
from ckpt_agent.pipeline.loader import ApplyFn, ApplyMode, InProcessLoader
from ckpt_agent.pipeline.pause_gate import PauseGate
from ckpt_agent.pipeline.reader import LoadProgress
from ckpt_agent.pipeline.relay_copy import ReadTensor, RelayGone
from ckpt_agent.pipeline.smoke import Verdict, check_outputs, failed, skipped
from ckpt_api.agent_api import HealthCheckRequest
from ckpt_api.manifest import ReferenceRecord, TensorRecord

# How often a request waiting for the parameters' lock looks again whether a pause came.
_PAUSE_RECHECK_S = 0.05


class PaddleEngine:
    name = "paddle"
    supports_infer = True
    checks_while_paused = True  # the check's forward pass runs whoever holds the pause
    stages_only = False

    def __init__(
        self,
        spec: ReferenceModelSpec,
        *,
        boot_weights: Path | None = None,
        apply_mode: ApplyMode = "staged",
        chunk_bytes: int,
        max_manifest_bytes: int,
        parallelism: int = 1,
        relay: bool = True,
    ) -> None:
        self.spec = spec
        self.boot_weights = boot_weights
        self._model: Any = None
        if boot_weights is None:
            self._model = build_model(spec)
            self._params = dict(self._model.state_dict())
        else:
            self._params = _checkpoint_tensors(boot_weights)
        self.supports_infer = self._model is not None
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

    def supported_dtypes(self) -> frozenset[str]:
        return supported_dtypes()

    @contextmanager
    def applying(self) -> Iterator[ApplyFn]:
        with self._lock:
            self._consistent = False
            self._generation += 1
            yield self._apply_tensor
            self._consistent = True

    def live_reader(self) -> ReadTensor:
        generation = self._generation

        def read(entry: TensorRecord) -> memoryview:
            with self._lock:
                if self._generation != generation or not self._consistent:
                    raise RelayGone("the live parameters changed since this version was loaded")
                return read_bytes(self._params[entry.name])

        return read

    def _apply_tensor(self, entry: TensorRecord, data: memoryview) -> None:
        write_bytes(self._params[entry.name], data)

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

    def _infer(self, *, traffic: bool = True) -> list[float]:
        """`traffic`: a request's forward pass, refused while paused; the smoke check's runs
        whoever holds the pause (it is not traffic)."""
        if traffic:
            self._acquire_for_traffic()
        else:
            self._lock.acquire()
        try:
            if not self._consistent:
                raise EngineUnavailable("the model holds no consistent weights")
            assert self._model is not None, "a checkpoint-shaped model serves no /v1/infer"
            with paddle.no_grad():
                out = self._model(paddle.to_tensor(self._input))
            return [float(v) for v in out.numpy().ravel()]
        finally:
            self._lock.release()

    def _acquire_for_traffic(self) -> None:
        """The lock for a request's forward pass, refused (EngineUnavailable) as soon as the
        engine is paused, also while waiting: a streamed apply holds the lock for its whole load,
        and a request that had passed the paused check just before the pause would otherwise
        queue behind it for seconds and then be answered by whatever version ends up live."""
        while True:
            if self._paused:
                raise EngineUnavailable("the engine is paused")
            if self._lock.acquire(timeout=_PAUSE_RECHECK_S):
                if not self._paused:
                    return
                self._lock.release()

    async def infer(self) -> list[float]:
        return await asyncio.to_thread(self._infer)

    async def smoke(self, check: HealthCheckRequest, reference: ReferenceRecord | None) -> Verdict:
        if self._model is None:
            return skipped("a checkpoint-shaped paddle model has no forward pass to probe")
        try:
            outputs = await asyncio.to_thread(self._infer, traffic=False)
        except EngineUnavailable as exc:
            return failed(str(exc))
        return check_outputs(outputs, reference)

    def describe(self) -> dict[str, Any]:
        model: dict[str, Any]
        if self.boot_weights is None:
            model = {"hidden": self.spec.hidden, "layers": self.spec.layers, "outputs": self.spec.outputs}
        else:
            dtypes = sorted({spec.dtype for spec in self._specs.values()})
            model = {"checkpoint": str(self.boot_weights), "tensors": len(self._specs), "dtypes": dtypes}
        return {
            "name": self.name,
            "apply_mode": self._loader.apply_mode,
            "model": model,
            "consistent": self._consistent,
        }


def _checkpoint_tensors(path: Path) -> dict[str, Any]:
    """Paddle tensors for every tensor of the boot checkpoint; refuses (BootCheckpointError)
    one holding a dtype this paddle lacks, before creating anything: the agent does not start."""
    tensors = boot_tensors(path)
    held = supported_dtypes()
    unheld = [f"{t.name!r} is {t.dtype}" for t in tensors if t.dtype not in held]
    if unheld:
        shown = ", ".join(unheld[:8]) + (f" and {len(unheld) - 8} more" if len(unheld) > 8 else "")
        raise BootCheckpointError(
            f"{path}: paddle {paddle.__version__} has no dtype for {shown} "
            f"(it holds {', '.join(sorted(held))})"
        )
    return {t.name: tensor_from_bytes(t.dtype, t.shape, t.read()) for t in tensors}
