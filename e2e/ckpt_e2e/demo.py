"""`make demo`: the main job, end to end on the local control plane.

Starts etcd + kube-apiserver + controller-manager + scheduler + kwok, installs the CRD, runs
the operator, creates a 4-pod worker Deployment whose pods run real agents (paddle reference
engine), publishes checkpoint versions, rolls out v1 and then v2 with verifyChecksum while
showing `ckpt-rollout watch`, proves with /v1/infer that every worker serves v2, tears down,
and ends with one line: `demo: OK ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from kubernetes import config

from ckpt_agent.formats.synth import expected_infer_output
from ckpt_api.tls import agent_server_name

from .cluster import ClusterOptions, LocalCluster
from .kubectl import Kubectl
from .podruntime import PodRuntime
from .provision import resolve
from .rollout_env import (
    CLI,
    WORKER_LABEL,
    AgentOptions,
    MintedAgentTokens,
    OperatorProcess,
    Rollouts,
    operator_token,
    publish_reference_version,
    ready_workers,
    serve_checkpoints,
    served_output,
    worker_deployment,
)

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml"
NAMESPACE = "rl"
BASE, V1, V2 = "global_step_0", "global_step_100", "global_step_200"


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _manifest_bytes(version_dir: Path) -> int:
    manifest = json.loads((version_dir / "manifest.json").read_text())
    return sum(int(t["nbytes"]) for t in manifest["tensors"])


def run(workers: int, hidden: int, layers: int, workdir: Path) -> int:
    started = time.monotonic()
    say("control-plane binaries (cache, else built from Go modules)")
    binaries = resolve(
        ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"]
    )
    with LocalCluster(binaries, ClusterOptions(workdir=workdir / "cluster", keep_workdir=True)) as cluster:
        kubectl = Kubectl(binaries["kubectl"], cluster.kubeconfig)
        say(f"local control plane up; export KUBECONFIG={cluster.kubeconfig}")
        kubectl.apply(CRD_FILE)
        kubectl.run("wait", "--for=condition=Established", "crd/checkpointrollouts.rollout.ckpt.dev")
        kubectl.run("create", "namespace", NAMESPACE)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        ns_kubectl = kubectl.in_namespace(NAMESPACE)

        root = workdir / "checkpoints"
        root.mkdir()
        say(f"publishing {BASE}, {V1}, {V2} (reference model, hidden={hidden}, layers={layers})")
        for seed, version in enumerate((BASE, V1, V2)):
            digest = publish_reference_version(root, version, seed + 1, workdir, hidden=hidden, layers=layers)
            print(f"    {version}: {digest}")
        size = _manifest_bytes(root / V2)

        with serve_checkpoints(root, workdir) as source:
            # The operator mints its agents' tokens for this account (TokenRequest, audience
            # ckpt-rollout-agent/NAMESPACE); ``token`` is one such, for the demo's own calls.
            token = operator_token(api, NAMESPACE)
            minted = MintedAgentTokens(NAMESPACE, "ckpt-operator")
            operator = OperatorProcess(cluster.kubeconfig, NAMESPACE, minted, workdir).start()
            try:
                say(f"operator running (log: {operator.log_path})")
                labels = {"app": WORKER_LABEL}
                ns_kubectl.apply(worker_deployment("workers", workers, labels))
                options = AgentOptions(
                    source_url=source.url,
                    initial_version=BASE,
                    kubeconfig=cluster.kubeconfig,
                    # No chart RBAC here: the allow-list fallback names the operator.
                    allowed_username=f"system:serviceaccount:{NAMESPACE}:ckpt-operator",
                    extra_args=["--model-hidden", str(hidden), "--model-layers", str(layers)],
                )
                with PodRuntime(
                    api, NAMESPACE, f"app={WORKER_LABEL}", options.launch, workdir / "pods"
                ) as runtime:
                    fleet = ready_workers(runtime, workers, token, timeout=180)
                    say(
                        f"{workers} worker pods running real agents: "
                        + ", ".join(f"{w.name}@{w.ip}" for w in fleet)
                    )
                    # The harness's defaults: each agent serves a certificate from the session's
                    # CA for the namespace's agent name, which the operator and peers verify.
                    say(f"agents serve https for {agent_server_name(NAMESPACE)}; CA {operator.agent_ca}")
                    rollouts = Rollouts(api, NAMESPACE)
                    spec = {
                        "version": V1,
                        "source": {"uri": source.url},
                        "selector": {"matchLabels": labels},
                        "strategy": {"waves": [1, "50%", "100%"]},
                    }
                    rollouts.create("fleet", spec)
                    _watch(cluster.kubeconfig, V1)
                    say(f"rolling out {V2} with verifyChecksum")
                    rollouts.patch_spec("fleet", {"version": V2, "verifyChecksum": True})
                    _watch(cluster.kubeconfig, V2)
                    print(ns_kubectl.run("get", "ckr").stdout, end="")
                    status = rollouts.status("fleet")
                    expected = expected_infer_output(root / V2)
                    for w in fleet:
                        got = served_output(w, token)
                        if not np.allclose(got, expected, atol=1e-5):
                            print(f"demo: FAILED: {w.name} does not serve {V2}", file=sys.stderr)
                            return 1
                    say(f"/v1/infer on every worker matches {V2}")
                    waves = len(status.get("waves") or [])
            finally:
                operator.stop()
    seconds = time.monotonic() - started
    loaded_gb = 2 * workers * size / 1e9
    print(f"demo: OK workers={workers} waves={waves} seconds={seconds:.1f} gb_loaded={loaded_gb:.3f}")
    return 0


def _watch(kubeconfig: Path, version: str) -> None:
    env_cmd = [*CLI, "watch", "fleet", "-n", NAMESPACE, "--timeout", "300"]
    proc = subprocess.run(env_cmd, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: FAILED: rollout of {version} did not succeed (watch exit {proc.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_e2e.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024, help="reference model width (sets GB loaded)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--workdir", type=Path, help="keep logs and state here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args.workers, args.hidden, args.layers, args.workdir)
    with tempfile.TemporaryDirectory(prefix="ckpt-demo-") as tmp:
        return run(args.workers, args.hidden, args.layers, Path(tmp))


if __name__ == "__main__":
    raise SystemExit(main())
