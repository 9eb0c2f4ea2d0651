"""The agent's status.workers.<pod> entry is the ckpt_api WorkerStatus model, and every field it
writes is in the generated CRD (the apiserver would silently prune any other): a real agent's
loads — started, succeeded, already live, failed, refused — captured at its reporter."""

from __future__ import annotations

from typing import Any

from agent_testkit import AgentFactory, Tree

from ckpt_agent.service.report import worker_status_patch
from ckpt_agent.service.reporting import DisabledReporter
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WorkerPhase, WorkerReason
from ckpt_e2e.crdschema import schema_problems, status_schema

ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "uid-7", "wave": 1}


class CapturingReporter(DisabledReporter):
    def __init__(self) -> None:
        super().__init__()
        self.entries: list[WorkerStatus] = []

    def worker_event(self, rollout: Any, entry: WorkerStatus) -> None:
        self.entries.append(entry)
        super().worker_event(rollout, entry)


async def test_every_entry_an_agent_writes_is_declared_by_the_crd(
    tree: Tree, agent_factory: AgentFactory
) -> None:
    client = await agent_factory(source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    reporter = CapturingReporter()
    assert client.agent is not None
    client.agent.service.reporter = reporter

    assert (await client.update("v2", rollout=ROLLOUT))[0] == 202
    await client.wait_settled()
    assert (await client.update("v2", rollout=ROLLOUT))[0] == 200  # already live
    assert (await client.update("v404", rollout=ROLLOUT))[0] == 202
    await client.wait_settled()
    assert (await client.update("a/b", rollout=ROLLOUT))[0] == 400  # refused, and reported

    seen = [(e.phase, e.reason) for e in reporter.entries]
    assert seen == [
        (WorkerPhase.LOADING, WorkerReason.LOADING),
        (WorkerPhase.UPDATED, WorkerReason.LOADED),
        (WorkerPhase.UPDATED, WorkerReason.LOADED),
        (WorkerPhase.LOADING, WorkerReason.LOADING),
        (WorkerPhase.FAILED, WorkerReason.VERSION_NOT_FOUND),
        (WorkerPhase.FAILED, WorkerReason.INVALID_VERSION),
    ]
    schema = status_schema()
    declared = set(schema["properties"]["workers"]["additionalProperties"]["properties"])
    for entry in reporter.entries:
        patch = worker_status_patch("worker-0", entry)
        assert schema_problems(patch["status"], schema) == []
        assert set(patch["status"]["workers"]["worker-0"]) == declared, "every field, unset ones null"
    failed = reporter.entries[-2]
    assert (failed.version, failed.live_version, failed.wave, failed.uid) == ("v404", "v2", 1, "uid-7")
    # /v1/status shows the same entry, plus which rollout it was for.
    last = (await client.status())["report"]["last"]
    assert last == {
        "rollout": "rl/fleet",
        **worker_status_patch("p", reporter.entries[-1])["status"]["workers"]["p"],
    }
