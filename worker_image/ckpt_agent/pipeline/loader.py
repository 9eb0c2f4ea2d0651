"""The load steps of engines that hold their weights in-process (the paddle reference engine);
the sequence they run in is `ckpt_agent.pipeline.sequence`'s.

staged:   pull + verify every tensor into host staging while traffic continues, then pause and
          copy into the live parameters. A failure before the copy changes nothing.
streamed: pause, then verify and apply tensor by tensor through one reusable buffer (memory:
          one chunk + the largest tensor). A failure restores the previous version from its
          source before resuming; if that fails too the engine refuses traffic (weights lost).

Before any tensor byte moves, the version's non-weight files (config, tokenizer, index) are
fetched and verified, always: the relay copy keeps them, so a peer serves the whole version.

Every load leaves a relay copy behind (see `ckpt_agent.pipeline.relay_copy`): the staging arena in
staged mode (kept until the next load changes the weights), the live parameters in streamed
mode. Unverified loads relay too: a receiver checks peer bytes against the source's manifest
whatever its own request said, so relay works with the default verifyChecksum false and a peer
cannot inject.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Literal, Protocol, cast, runtime_checkable

import numpy as np

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.pipeline.compat import ParamSpec, check_compatible
from ckpt_agent.pipeline.load_job import LiveWeights, LoadJob, LoadOutcome
from ckpt_agent.pipeline.pause_gate import PauseGate
from ckpt_agent.pipeline.reader import (
    DEFAULT_CHUNK_BYTES,
    LoadProgress,
    fetch_manifest,
    plan_runs,
    read_runs,
)
from ckpt_agent.pipeline.relay_copy import ReadTensor, RelayCopy
from ckpt_agent.pipeline.sequence import Load, Staging, run_load
from ckpt_agent.pipeline.staging import StagingArea
from ckpt_agent.transport import Transport, open_transport
from ckpt_agent.transport.abort import LOAD_ABORT
from ckpt_api.manifest import ManifestDocument, TensorRecord

log = logging.getLogger(__name__)

ApplyMode = Literal["staged", "streamed"]
ApplyFn = Callable[[TensorRecord, memoryview], None]


class WeightsTarget(Protocol):
    """What an in-process engine exposes to the loader."""

    def parameter_specs(self) -> Mapping[str, ParamSpec]: ...

    def applying(self) -> AbstractContextManager[ApplyFn]:
        """Exclusive access for writing parameters. The model counts as inconsistent (refuses
        inference) from entry until the block exits without an exception."""
        ...


@runtime_checkable
class HoldsSomeDtypes(Protocol):
    """A target that cannot hold every safetensors dtype (paddle has no F8_E8M0, F4...)."""

    def supported_dtypes(self) -> frozenset[str]: ...


@runtime_checkable
class ReadsLiveWeights(Protocol):
    def live_reader(self) -> ReadTensor:
        """Reads a tensor's bytes from the live parameters; refuses once they change again."""
        ...


class InProcessLoader:
    """The load steps of an engine that holds its weights in-process (see `sequence`)."""

    label = "the engine"
    pulls_weights_itself = False
    ranks: frozenset[int] | None = None  # one process holds the whole model
    # A model whose apply failed refuses inference by itself (`WeightsTarget.applying`).
    pauses_lost_weights = False

    def __init__(
        self,
        target: WeightsTarget,
        *,
        apply_mode: ApplyMode = "staged",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
        parallelism: int = 1,
        relay: bool = True,
    ) -> None:
        self._target = target
        self.apply_mode: ApplyMode = apply_mode
        self.chunk_bytes = chunk_bytes
        self.max_manifest_bytes = max_manifest_bytes
        self.parallelism = parallelism
        self._relay = relay
        # Pipelined relay from the staging arena: a chain's members start within moments of
        # each other.
        self.relays_while_staging = relay

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        return await run_load(self, job, gate, progress)

    # -- LoadSteps -------------------------------------------------------------------------------
    async def prepare(self, job: LoadJob) -> None:
        pass

    def check(self, manifest: ManifestDocument) -> None:
        holds = self._target.supported_dtypes() if isinstance(self._target, HoldsSomeDtypes) else None
        check_compatible(manifest, self._target.parameter_specs(), holds=holds)

    def staging(self, load: Load) -> Staging | None:
        return StagingArea(load.document) if self.apply_mode == "staged" else None

    def staged(self, load: Load) -> None:
        pass

    async def apply_load(self, load: Load) -> None:
        job, manifest = load.job, load.document
        try:
            if load.staging is not None:
                await asyncio.to_thread(self._apply_all, manifest, load.staging.buffer)
            else:
                assert load.transport is not None
                await asyncio.to_thread(
                    self._stream_apply,
                    load.transport,
                    manifest,
                    job.must_verify,
                    load.progress,
                    job.cancel.is_set,
                    check_finite=job.check_finite,
                )
        except LoadError:
            raise
        except Exception as exc:
            raise LoadError(Reason.ENGINE_ERROR, f"applying weights failed: {exc!r}") from exc

    def landed(self, load: Load) -> RelayCopy | None:
        if load.staging is None:
            return self._live_copy(load.raw, load.document, load.extra)
        if not self._relay:
            load.staging.release()
            return None
        arena = cast(StagingArea, load.staging)
        return load.early_relay or RelayCopy.from_store(load.raw, load.document, arena, load.extra)

    def lost(self) -> None:
        pass

    def _apply_all(
        self, manifest: ManifestDocument, buffer_for: Callable[[TensorRecord], memoryview]
    ) -> None:
        with self._target.applying() as apply:
            for entry in manifest.tensors:
                apply(entry, buffer_for(entry))

    def _live_copy(
        self, raw: bytes, manifest: ManifestDocument, extra: Mapping[str, bytes]
    ) -> RelayCopy | None:
        if not (self._relay and isinstance(self._target, ReadsLiveWeights)):
            return None
        return RelayCopy(
            raw, manifest, self._target.live_reader(), source="live-parameters", extra_files=extra
        )

    def _stream_apply(
        self,
        transport: Transport,
        manifest: ManifestDocument,
        verify: bool,
        progress: LoadProgress,
        cancelled: Callable[[], bool],
        *,
        check_finite: bool = False,
    ) -> None:
        buf = np.empty(max(manifest.largest_tensor_bytes, 1), dtype=np.uint8).data
        with self._target.applying() as apply:
            read_runs(
                transport,
                manifest.version,
                plan_runs(manifest),
                buffer_for=lambda entry: buf[: entry.nbytes],
                on_tensor=apply,
                verify=verify,
                progress=progress,
                cancelled=cancelled,
                chunk_bytes=self.chunk_bytes,
                check_finite=check_finite,
            )

    async def restore(self, load: Load, failure: LoadError) -> LoadError:
        """Put the previous version back after a failed apply: `failure`, or a loss if that
        fails too."""
        previous = load.job.previous
        if previous is None or previous.source_uri is None:
            return LoadError(
                failure.reason,
                f"{failure.message}; no previous version to restore, the model holds no consistent weights",
                tensor=failure.tensor,
                weights_lost=True,
            )
        started = time.monotonic()
        try:
            await asyncio.to_thread(self._reload, previous)
        except Exception as exc:
            log.exception("restoring %s failed", previous.version)
            return LoadError(
                failure.reason,
                f"{failure.message}; restoring {previous.version} failed ({exc}), "
                "the model holds no consistent weights",
                tensor=failure.tensor,
                weights_lost=True,
            )
        log.info(
            "restored %s in %.2fs after: %s", previous.version, time.monotonic() - started, failure.message
        )
        return failure

    def _reload(self, previous: LiveWeights) -> None:
        assert previous.source_uri is not None
        # Run in a thread of its own context: the abort that stopped the load must not stop the
        # restore that undoes it.
        LOAD_ABORT.set(None)
        transport = open_transport(previous.source_uri)
        try:
            manifest, _ = fetch_manifest(
                transport,
                previous.version,
                expected_digest=previous.manifest_digest,
                max_bytes=self.max_manifest_bytes,
            )
            self._stream_apply(transport, manifest, previous.checksum_verified, LoadProgress(), lambda: False)
        finally:
            transport.close()
