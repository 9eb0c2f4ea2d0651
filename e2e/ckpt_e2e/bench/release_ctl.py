"""The control half of `bench release`, run inside the bench's control namespace
(`python -m ckpt_e2e.bench.release_ctl '<json>'`): a local control plane and the operator live
there, as they would on a cluster's control nodes, beside agents reachable only over the bench's
capped links.

It makes one kwok pod per agent at that agent's address (kwok_stages.POD_IP_ANNOTATION), a
CheckpointRollout over them at the version the agents booted with, and then runs the trainer's
step the way a trainer runs it: `ckpt-rollout release` (its library call, `tools.client.release`)
publishes the new checkpoint directory into the directory the source serves, sets it as the
target and waits until the CR reports the fleet done. Meanwhile a thread reads every agent's
`/v1/status` twice a second to see when the first and the last replica serve the new version.
Prints one JSON line of timings.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client, config

from ckpt_api.vocabulary import Phase, PodPhase
from ckpt_e2e.bench.controlplane_env import CONTROL_PLANE, create_namespace, install_crd
from ckpt_e2e.bench.fleet_ctl import agent_status, serves
from ckpt_e2e.cluster import ClusterOptions, LocalCluster
from ckpt_e2e.kwok_stages import POD_IP_ANNOTATION
from ckpt_e2e.procs import wait_for
from ckpt_e2e.provision import resolve
from ckpt_e2e.rollout_env import OperatorProcess, Rollouts, rollout_spec

NAMESPACE = "bench"
ROLLOUT = "fleet"
LABELS = {"app": "release-worker"}
POLL_S = 0.5  # an agent's /v1/status costs it ~2 ms of CPU: twice a second is noise


def worker_pod(name: str, ip: str) -> dict[str, Any]:
    """A kwok pod that kwok gives the address `ip` (an agent's, in its namespace)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(LABELS), "annotations": {POD_IP_ANNOTATION: ip}},
        "spec": {"containers": [{"name": "worker", "image": "ckpt-rollout-worker:dev"}]},
    }


def _serving(url: str, version: str) -> bool:
    """Whether the agent serves `version`; False too while it cannot say (read again later)."""
    try:
        return serves(agent_status(url), version)
    except (OSError, ValueError):  # unreachable for now, or not a status (ValidationError)
        return False


class ServingWatch:
    """When each agent first served `version`, in seconds after `start` (a daemon thread)."""

    def __init__(self, agents: list[str], version: str, start: float) -> None:
        self.agents, self.version, self.start = agents, version, start
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.first_seen) < len(self.agents):
            for url in self.agents:
                if url not in self.first_seen and _serving(url, self.version):
                    self.first_seen[url] = time.monotonic() - self.start
            self._stop.wait(POLL_S)

    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for every agent, then stop reading."""
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join()


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(cfg["workdir"])
    agents: dict[str, str] = cfg["agents"]  # pod name -> agent URL
    with ExitStack() as stack:
        t0 = time.monotonic()
        cluster = stack.enter_context(
            LocalCluster(resolve(CONTROL_PLANE), ClusterOptions(workdir=workdir / "cluster"))
        )
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(cluster.kubeconfig)
        )
        stack.callback(api.close)
        install_crd(api)
        create_namespace(api, NAMESPACE)
        core = client.CoreV1Api(api)
        for name, url in agents.items():
            core.create_namespaced_pod(NAMESPACE, worker_pod(name, urlsplit(url).hostname or ""))

        def running() -> bool:
            pods = core.list_namespaced_pod(NAMESPACE).items
            return len(pods) == len(agents) and all(
                p.status.phase == PodPhase.RUNNING
                and p.status.pod_ip == p.metadata.annotations[POD_IP_ANNOTATION]
                for p in pods
            )

        wait_for(running, 120, f"{len(agents)} pods Running at their agents' addresses", interval=0.2)
        token_file = workdir / "agent-token"
        token_file.write_text(secrets.token_urlsafe(32))
        token_file.chmod(0o600)
        operator = OperatorProcess(cluster.kubeconfig, NAMESPACE, token_file, workdir, agent_tls=False)
        operator.start()
        stack.callback(operator.stop)
        rollouts = Rollouts(api, NAMESPACE)
        spec = rollout_spec(
            cfg["source"],
            cfg["boot_version"],
            LABELS,
            verifyChecksum=True,
            strategy={"waves": cfg["waves"]},
        )
        rollouts.create(ROLLOUT, spec)
        rollouts.wait_phase(ROLLOUT, {Phase.SUCCEEDED}, timeout=300, version=cfg["boot_version"])
        setup_s = time.monotonic() - t0

        # Imported here: the release client is the operator package's, and this is its caller.
        from ckpt_rollout.tools.client import release

        version = cfg["version"]
        started = time.monotonic()
        watch = ServingWatch(list(agents.values()), version, started)
        result = release(
            version,
            source_dir=cfg["trainer_dir"],
            rollout=ROLLOUT,
            namespace=NAMESPACE,
            publish_root=cfg["publish_root"],
            link=True,
            kubeconfig=cluster.kubeconfig,
            timeout=cfg["limit_s"],
        )
        released_s = time.monotonic() - started
        watch.finish(timeout=60)
        if result.phase != Phase.SUCCEEDED or len(watch.first_seen) < len(agents):
            raise SystemExit(
                f"release ended {result.phase} ({result.summary}); agents serving {version}: "
                f"{sorted(watch.first_seen)} of {sorted(agents.values())}; operator log: {operator.log_path}"
            )
        assert result.published is not None
        return {
            "setup_s": setup_s,
            "publish_s": result.published.seconds,
            "published_bytes": result.published.bytes,
            "first_serving_s": min(watch.first_seen.values()),
            "all_serving_s": max(watch.first_seen.values()),
            "released_s": released_s,
            "summary": result.summary,
        }


def main(argv: list[str]) -> int:
    print(json.dumps(run(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
