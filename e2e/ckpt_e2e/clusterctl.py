"""`make cluster-up` / `make cluster-down`: a local cluster that outlives the command.

`up` starts a detached supervisor (`run`) that owns the control-plane processes and tears
them down on SIGTERM; `down` sends that SIGTERM and waits. State lives in --state-dir
(default `.cluster/`): kubeconfig, supervisor pid, and its log. `--real-node` (`make cluster-up
REAL_NODE=1`) adds the real kubelet node beside the kwok ones (realnode.py): pods pinned to it
(nodeSelector kubernetes.io/hostname=ckpt-real-node, tolerating e2e.ckpt.dev/real-node) run the
images `make images` built once they are imported (`ctr --address <state>/realnode-containerd.sock
-n k8s.io images import`; the supervisor imports the operator and worker images when they exist).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .cluster import ClusterOptions, LocalCluster
from .procs import WaitTimeout, descendants, wait_for
from .provision import ProvisionError, resolve
from .realnode import BINARIES as REAL_NODE_BINARIES

_CONTROL_PLANE = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still "exists"; /proc tells.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read_pid(state: Path) -> int | None:
    try:
        pid = int((state / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _binaries(real_node: bool) -> list[str]:
    return [*_CONTROL_PLANE, *(REAL_NODE_BINARIES if real_node else [])]


def _import_built_images(cluster: LocalCluster) -> None:
    """The operator and worker images into the real node, those `make images` has built."""
    from . import images

    assert cluster.real_node is not None
    built = [spec.tag for spec in images.IMAGES.values() if images.image_exists(spec.tag)]
    for tag, seconds in cluster.real_node.import_images(built).items():
        print(f"imported {tag} into the real node in {seconds:.0f}s", flush=True)


def cmd_run(state: Path, nodes: int, real_node: bool = False) -> int:
    """Foreground supervisor: start, publish the kubeconfig, wait for SIGTERM/SIGINT, stop."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    binaries = resolve(_binaries(real_node))
    cluster = LocalCluster(binaries, ClusterOptions(nodes=nodes, real_node=real_node))
    with cluster:
        if cluster.real_node is not None:
            _import_built_images(cluster)
            link = state / "realnode-containerd.sock"
            link.unlink(missing_ok=True)
            link.symlink_to(cluster.real_node.containerd_socket)
        tmp = state / "kubeconfig.tmp"
        tmp.write_bytes(cluster.kubeconfig.read_bytes())
        tmp.chmod(0o600)
        os.replace(tmp, state / "kubeconfig")
        node = ""
        if cluster.real_node is not None:
            node = f"; real node {cluster.real_node.net.node_ip}, pods reach {cluster.pod_server}"
        print(
            f"cluster ready in {cluster.timings['total']:.1f}s at {cluster.server}{node} "
            f"(workdir {cluster.workdir})",
            flush=True,
        )
        while not stopping.wait(1.0):
            dead = [n for n, p in cluster.pids.items() if not _alive(p)]
            if dead:
                print(f"control-plane process(es) exited: {dead}; stopping", flush=True)
                break
    (state / "kubeconfig").unlink(missing_ok=True)
    (state / "realnode-containerd.sock").unlink(missing_ok=True)
    if cluster.teardown_leftovers:
        print(f"cluster stopped; left behind: {cluster.teardown_leftovers}", flush=True)
        return 1
    print("cluster stopped", flush=True)
    return 0


def env_lines(state: Path) -> list[str]:
    """What a shell needs to use the cluster in ``state``: its kubeconfig, and kubectl, helm and
    ckpt-rollout on PATH (README: `eval "$(make -s cluster-env)"`)."""
    tools = resolve(["kubectl", "helm"])
    dirs = [str(path.parent) for path in tools.values()]
    venv = Path(sys.executable).parent  # the interpreter make ran: the project's venv when set up
    if (venv / "ckpt-rollout").exists():
        dirs.append(str(venv))
    path = ":".join(dict.fromkeys(dirs))
    return [f"export KUBECONFIG={(state / 'kubeconfig').resolve()}", f'export PATH="{path}:$PATH"']


def _usage(state: Path) -> str:
    return "\n".join(
        [
            'to use it: eval "$(make -s cluster-env)", which runs:',
            *(f"  {line}" for line in env_lines(state)),
        ]
    )


def cmd_env(state: Path) -> int:
    if _read_pid(state) is None or not (state / "kubeconfig").exists():
        print(f"cluster-env: no local cluster running (state {state}); make cluster-up", file=sys.stderr)
        return 1
    print("\n".join(env_lines(state)))
    return 0


def cmd_up(state: Path, nodes: int, timeout: float, real_node: bool = False) -> int:
    kubeconfig = state / "kubeconfig"
    if _read_pid(state) is not None and kubeconfig.exists():
        print(f"cluster already running.\n{_usage(state)}")
        return 0
    try:  # provision in the foreground so build errors and progress reach the terminal
        resolve([*_binaries(real_node), "kubectl"])
    except ProvisionError as exc:
        print(f"cluster-up: {exc}", file=sys.stderr)
        return 1
    kubeconfig.unlink(missing_ok=True)
    log = state / "cluster.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckpt_e2e.clusterctl",
                "run",
                "--state-dir",
                str(state),
                "--nodes",
                str(nodes),
                *(["--real-node"] if real_node else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the make process, by design
            env={**os.environ, "PYTHONPATH": _pythonpath()},
        )
    (state / "supervisor.pid").write_text(str(proc.pid))
    try:
        wait_for(
            lambda: kubeconfig.exists() or proc.poll() is not None, timeout, "the local cluster to start"
        )
    except WaitTimeout as exc:
        print(f"cluster-up: {exc}; see {log}", file=sys.stderr)
        cmd_down(state, 60.0)
        return 1
    if not kubeconfig.exists():
        print(
            f"cluster-up: supervisor exited with {proc.returncode}; see {log}:\n"
            + "\n".join(log.read_text(errors="replace").splitlines()[-30:]),
            file=sys.stderr,
        )
        return 1
    print(log.read_text(errors="replace").strip().splitlines()[-1])
    print(_usage(state))
    return 0


def cmd_down(state: Path, timeout: float) -> int:
    pid = _read_pid(state)
    if pid is None:
        print("no local cluster running")
        (state / "supervisor.pid").unlink(missing_ok=True)
        return 0
    children = descendants(pid)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = [p for p in children | {pid} if _alive(p)]
    for p in leftovers:  # the supervisor failed to clean up in time: do it for it
        os.kill(p, signal.SIGKILL)
    (state / "supervisor.pid").unlink(missing_ok=True)
    (state / "kubeconfig").unlink(missing_ok=True)
    print("cluster stopped" + (f" (killed stragglers {leftovers})" if leftovers else ""))
    return 0


def _pythonpath() -> str:
    here = str(Path(__file__).resolve().parent.parent)
    existing = os.environ.get("PYTHONPATH")
    return f"{here}:{existing}" if existing else here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "run", "env"])
    parser.add_argument("--state-dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="add one real kubelet + containerd node beside the kwok ones (needs root)",
    )
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    if args.action == "env":
        return cmd_env(args.state_dir)
    if args.action == "run":
        return cmd_run(args.state_dir, args.nodes, args.real_node)
    if args.action == "up":
        # Importing images (~30 s each) comes before the kubeconfig is published.
        timeout = args.timeout + (240.0 if args.real_node else 0.0)
        return cmd_up(args.state_dir, args.nodes, timeout, args.real_node)
    return cmd_down(args.state_dir, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
