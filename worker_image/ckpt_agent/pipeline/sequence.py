"""The load sequence, one for every engine family: open the version (its manifest, digest-checked)
→ let the engine refuse it → fetch its non-weight files → stage its tensors (pulled and verified
while traffic continues) → hold the engine paused → apply → on failure restore → resume → hand
back a relay copy. An engine supplies the steps that are its own (`LoadSteps`); the order, the
pause, and what a failure leaves are decided here.

Failure truth, for every engine: a failure before the apply changes nothing (the staged copy
goes); a failed apply is the engine's to undo (`LoadSteps.restore`), still paused; an error
with `weights_lost` means nothing consistent is known to serve. A resume that fails after the
apply leaves the engine paused with whatever it holds: reported `weights_lost`, so the pod does
not look Ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol, cast

from ckpt_agent.common.errors import LoadError
from ckpt_agent.pipeline.load_job import LoadJob, LoadOutcome
from ckpt_agent.pipeline.pause_gate import LOAD, WEIGHTS_LOST, PauseGate
from ckpt_agent.pipeline.pull import PullTarget, checksum_verified, open_version, pull_into
from ckpt_agent.pipeline.reader import LoadProgress, fetch_manifest, read_extra_files
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.staging import TensorStore
from ckpt_agent.transport import Transport, open_transport
from ckpt_api.manifest import ManifestDocument, share


class Staging(PullTarget, Protocol):
    """Where a load's tensors land before the apply."""

    def release(self) -> None: ...


@dataclass
class Load:
    """One load's state, from the manifest to the relay copy."""

    job: LoadJob
    progress: LoadProgress
    manifest: ManifestDocument | None = None  # None: no source known (an engine that pulls by itself)
    digest: str | None = None
    raw: bytes = b""
    transport: Transport | None = None  # open while tensor bytes may still be read
    extra: dict[str, bytes] = field(default_factory=dict)
    staging: Staging | None = None  # None: the apply streams from `transport`
    # The copy peers read while the tensors are still arriving (pipelined relay).
    early_relay: RelayCopy | None = None

    @property
    def document(self) -> ManifestDocument:
        """The manifest, for the steps that run only once the version is open."""
        assert self.manifest is not None, "the version was not opened"
        return self.manifest


class LoadSteps(Protocol):
    """What an engine family supplies to the load sequence."""

    label: str  # the engine as messages name it
    # The engine reads the version itself (FastDeploy): the sequence fetches its manifest when a
    # source is known, and moves no tensor byte.
    pulls_weights_itself: bool
    # After a load that lost its weights the engine stays paused (holder WEIGHTS_LOST) until a
    # load succeeds: for engines whose own API would serve them anyway.
    pauses_lost_weights: bool
    # Staged tensors can be relayed to peers as they arrive (the staging is a TensorStore).
    relays_while_staging: bool
    # The tensor-parallel ranks this pod's engine runs: of a version saved per rank, the share
    # they read is all that is pulled (None: every file).
    ranks: frozenset[int] | None
    max_manifest_bytes: int
    chunk_bytes: int
    parallelism: int

    async def prepare(self, job: LoadJob) -> None:
        """Before anything is fetched: refuse what this engine cannot do."""
        ...

    def check(self, manifest: ManifestDocument) -> None:
        """Before any tensor byte moves: refuse a version the engine cannot hold."""
        ...

    def staging(self, load: Load) -> Staging | None:
        """Where to stage `load`'s tensors (run in a thread), or None to stream them in the apply."""
        ...

    def staged(self, load: Load) -> None:
        """Every tensor is staged and verified (run in a thread)."""
        ...

    async def apply_load(self, load: Load) -> None:
        """Put `load` into the engine (traffic paused); a LoadError if it failed."""
        ...

    async def restore(self, load: Load, failure: LoadError) -> LoadError:
        """After `failure` of the apply, still paused: put the previous weights back if they may
        have been touched. The error to report; `weights_lost` if nothing consistent serves."""
        ...

    def landed(self, load: Load) -> RelayCopy | None:
        """The load succeeded and traffic is back: keep what it staged; the copy to relay."""
        ...

    def lost(self) -> None:
        """The load left weights nobody can vouch for."""
        ...


async def run_load(steps: LoadSteps, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
    """Load `job.version` into the engine behind `steps`, pausing through `gate` only around the
    apply. Raises LoadError; unless it has `weights_lost`, the previous weights serve again."""
    await steps.prepare(job)
    load = Load(job, progress)
    if steps.pulls_weights_itself:
        await _read_manifest(steps, load)
        verified = job.must_verify
    else:
        load.transport, load.manifest, load.digest, load.raw = await open_version(
            job, steps.max_manifest_bytes
        )
        if steps.ranks is not None:
            load.manifest = share(load.manifest, steps.ranks)
        verified = checksum_verified(job, load.transport)
    try:
        if load.manifest is not None:
            steps.check(load.manifest)
            progress.bytes_total = load.manifest.tensor_bytes
        if load.transport is not None:
            await _stage(steps, load)
        await _apply(steps, load, gate)
    except BaseException:
        _drop(load)
        raise
    finally:
        _close(load)
    relay = steps.landed(load)
    nbytes = 0 if load.manifest is None else load.manifest.tensor_bytes
    if steps.pulls_weights_itself:
        progress.bytes_done = nbytes
    return LoadOutcome(
        nbytes,
        verified,
        load.digest,
        relay,
        from_peer=job.peer is not None and not steps.pulls_weights_itself,
        reference=None if load.manifest is None else load.manifest.reference,
    )


async def _read_manifest(steps: LoadSteps, load: Load) -> None:
    """The manifest alone, from the source (no peer: no byte is read through the agent)."""
    job = load.job
    if job.source_uri is None:
        return
    transport = open_transport(job.source_uri)
    try:
        load.manifest, load.digest = await asyncio.to_thread(
            fetch_manifest,
            transport,
            job.version,
            expected_digest=job.manifest_digest,
            max_bytes=steps.max_manifest_bytes,
        )
    finally:
        transport.close()


async def _stage(steps: LoadSteps, load: Load) -> None:
    job, manifest, transport = load.job, load.document, load.transport
    assert transport is not None
    load.extra = await asyncio.to_thread(read_extra_files, transport, manifest, cancelled=job.cancel.is_set)
    load.staging = await asyncio.to_thread(steps.staging, load)
    if load.staging is None:
        return
    if steps.relays_while_staging and job.relay_while_loading and job.publish_relay is not None:
        # Pipelined relay: peers read this copy tensor by tensor while the pull below runs.
        store = cast(TensorStore, load.staging)
        load.early_relay = RelayCopy.in_progress(load.raw, manifest, store, asyncio.get_running_loop())
        load.early_relay.set_extra_files(load.extra)
        job.publish_relay(load.early_relay)

    def pull() -> None:
        assert load.staging is not None
        pull_into(
            transport,
            job,
            manifest,
            load.staging,
            load.progress,
            chunk_bytes=steps.chunk_bytes,
            parallelism=steps.parallelism,
            relay=load.early_relay,
        )
        steps.staged(load)

    await asyncio.to_thread(pull)
    _close(load)  # every byte is staged: the apply reads none


async def _apply(steps: LoadSteps, load: Load, gate: PauseGate) -> None:
    failure: LoadError | None = None
    applied = False
    try:
        async with gate.hold(LOAD):
            try:
                await steps.apply_load(load)
            except LoadError as exc:
                failure = await steps.restore(load, exc)
                if failure.weights_lost and steps.pauses_lost_weights:
                    # Keep the engine paused once this load's hold ends, until a load succeeds.
                    await gate.acquire(WEIGHTS_LOST)
                if failure is exc:
                    raise
                raise failure from exc
            if steps.pauses_lost_weights:
                await gate.release(WEIGHTS_LOST)
            applied = True
    except LoadError as exc:
        if exc is failure or (failure is None and not applied):
            # The load's own failure, or a pause that failed (nothing was touched).
            if exc.weights_lost:
                steps.lost()
            raise
        # The resume failed: the engine may be gone, or stay paused with whatever it holds.
        steps.lost()
        done = failure.message if failure is not None else f"{load.job.version} loaded and confirmed"
        raise LoadError(
            failure.reason if failure is not None else exc.reason,
            f"{done}, but resuming {steps.label} failed: {exc.message}",
            weights_lost=True,
        ) from exc


def _drop(load: Load) -> None:
    """A failed load: its copies go (readers of the early relay stop: it never relays bytes of a
    failed load)."""
    if load.early_relay is not None:
        load.early_relay.release()
    if load.staging is not None:
        load.staging.release()


def _close(load: Load) -> None:
    if load.transport is not None:
        load.transport.close()
        load.transport = None
