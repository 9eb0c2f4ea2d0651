"""`make cluster-up` / `make cluster-down`: a local cluster that outlives the command.

`up` starts a detached supervisor (`run`) that owns the control-plane processes and tears
them down on SIGTERM; `down` sends that SIGTERM and waits. State lives in --state-dir
(default `.cluster/`): kubeconfig, supervisor pid, and its log.
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


def cmd_run(state: Path, nodes: int) -> int:
    """Foreground supervisor: start, publish the kubeconfig, wait for SIGTERM/SIGINT, stop."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    binaries = resolve(_CONTROL_PLANE)
    cluster = LocalCluster(binaries, ClusterOptions(nodes=nodes))
    with cluster:
        tmp = state / "kubeconfig.tmp"
        tmp.write_bytes(cluster.kubeconfig.read_bytes())
        tmp.chmod(0o600)
        os.replace(tmp, state / "kubeconfig")
        print(
            f"cluster ready in {cluster.timings['total']:.1f}s at {cluster.server} "
            f"(workdir {cluster.workdir})",
            flush=True,
        )
        while not stopping.wait(1.0):
            dead = [n for n, p in cluster.pids.items() if not _alive(p)]
            if dead:
                print(f"control-plane process(es) exited: {dead}; stopping", flush=True)
                break
    (state / "kubeconfig").unlink(missing_ok=True)
    print("cluster stopped", flush=True)
    return 0


def cmd_up(state: Path, nodes: int, timeout: float) -> int:
    kubeconfig = state / "kubeconfig"
    export = f"export KUBECONFIG={kubeconfig.resolve()}"
    if _read_pid(state) is not None and kubeconfig.exists():
        print(f"cluster already running.\n{export}")
        return 0
    try:  # provision in the foreground so build errors and progress reach the terminal
        resolve([*_CONTROL_PLANE, "kubectl"])
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
    print(export)
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
    parser.add_argument("action", choices=["up", "down", "run"])
    parser.add_argument("--state-dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    if args.action == "run":
        return cmd_run(args.state_dir, args.nodes)
    if args.action == "up":
        return cmd_up(args.state_dir, args.nodes, args.timeout)
    return cmd_down(args.state_dir, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
