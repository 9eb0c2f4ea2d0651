"""Loads for engines that hold their weights in-process (the paddle reference engine).

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
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.pipeline.compat import ParamSpec, check_compatible
from ckpt_agent.pipeline.load_job import LiveWeights, LoadJob, LoadOutcome
from ckpt_agent.pipeline.pause_gate import LOAD, PauseGate
from ckpt_agent.pipeline.pull import checksum_verified, open_version, pull_into
from ckpt_agent.pipeline.reader import (
    DEFAULT_CHUNK_BYTES,
    LoadProgress,
    fetch_manifest,
    plan_runs,
    read_extra_files,
    read_runs,
)
from ckpt_agent.pipeline.relay_copy import ReadTensor, RelayCopy
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
        self._chunk = chunk_bytes
        self._max_manifest = max_manifest_bytes
        self._parallelism = parallelism
        self._relay = relay

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        transport, manifest, digest, raw = await open_version(job, self._max_manifest)
        verified = checksum_verified(job, transport)
        try:
            holds = self._target.supported_dtypes() if isinstance(self._target, HoldsSomeDtypes) else None
            check_compatible(manifest, self._target.parameter_specs(), holds=holds)
            progress.bytes_total = manifest.tensor_bytes
            if self.apply_mode == "staged":
                relay = await self._staged(transport, manifest, raw, job, gate, progress)
            else:
                extra = await _read_extras(transport, manifest, job)
                await self._streamed(transport, manifest, job, gate, progress)
                relay = self._live_copy(raw, manifest, extra)
        finally:
            transport.close()
        return LoadOutcome(
            manifest.tensor_bytes,
            verified,
            digest,
            relay,
            from_peer=job.peer is not None,
            reference=manifest.reference,
        )

    async def _staged(
        self,
        transport: Transport,
        manifest: ManifestDocument,
        raw: bytes,
        job: LoadJob,
        gate: PauseGate,
        progress: LoadProgress,
    ) -> RelayCopy | None:
        staging = StagingArea(manifest)
        relay: RelayCopy | None = None
        # Pipelined relay: peers read this copy file by file and tensor by tensor while the
        # reads below run; published first, so a chain's members start within moments of each other.
        early = None
        if self._relay and job.relay_while_loading and job.publish_relay is not None:
            early = RelayCopy.in_progress(raw, manifest, staging, asyncio.get_running_loop())
            job.publish_relay(early)
        try:
            extra = await _read_extras(transport, manifest, job)
            if early is not None:
                early.set_extra_files(extra)

            def pull() -> None:
                pull_into(
                    transport,
                    job,
                    manifest,
                    staging,
                    progress,
                    chunk_bytes=self._chunk,
                    parallelism=self._parallelism,
                    relay=early,
                )

            await asyncio.to_thread(pull)
            async with gate.hold(LOAD):
                try:
                    await asyncio.to_thread(self._apply_all, manifest, staging.buffer)
                except Exception as exc:
                    await self._restore(job, _as_load_error(exc))
            if self._relay:
                relay = early or RelayCopy.from_store(raw, manifest, staging, extra)
            return relay
        finally:
            if relay is None:
                if early is not None:
                    early.release()  # its readers stop; it never relays bytes of a failed load
                staging.release()

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

    async def _streamed(
        self,
        transport: Transport,
        manifest: ManifestDocument,
        job: LoadJob,
        gate: PauseGate,
        progress: LoadProgress,
    ) -> None:
        async with gate.hold(LOAD):
            try:
                await asyncio.to_thread(
                    self._stream_apply,
                    transport,
                    manifest,
                    job.must_verify,
                    progress,
                    job.cancel.is_set,
                    check_finite=job.check_finite,
                )
            except Exception as exc:
                await self._restore(job, _as_load_error(exc))

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
                chunk_bytes=self._chunk,
                check_finite=check_finite,
            )

    async def _restore(self, job: LoadJob, failure: LoadError) -> None:
        """Put the previous version back after a failed apply, then re-raise `failure`."""
        previous = job.previous
        if previous is None or previous.source_uri is None:
            raise LoadError(
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
            raise LoadError(
                failure.reason,
                f"{failure.message}; restoring {previous.version} failed ({exc}), "
                "the model holds no consistent weights",
                tensor=failure.tensor,
                weights_lost=True,
            ) from exc
        log.info(
            "restored %s in %.2fs after: %s", previous.version, time.monotonic() - started, failure.message
        )
        raise failure

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
                max_bytes=self._max_manifest,
            )
            self._stream_apply(transport, manifest, previous.checksum_verified, LoadProgress(), lambda: False)
        finally:
            transport.close()


async def _read_extras(transport: Transport, manifest: ManifestDocument, job: LoadJob) -> dict[str, bytes]:
    return await asyncio.to_thread(read_extra_files, transport, manifest, cancelled=job.cancel.is_set)


def _as_load_error(exc: Exception) -> LoadError:
    if isinstance(exc, LoadError):
        return exc
    return LoadError(Reason.ENGINE_ERROR, f"applying weights failed: {exc!r}")
