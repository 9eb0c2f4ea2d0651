"""The real node's generated configuration, without starting anything: containerd keeps every
file under the node's directory, the CNI subnet and node addresses come from the claimed index,
and the runc wrapper drops what these VMs refuse."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from ckpt_e2e import images
from ckpt_e2e.nodenet import NodeNetwork
from ckpt_e2e.realnode import NODE_NAME, TAINT_KEY, RealNode, placement


def _node(tmp_path: Path) -> RealNode:
    return RealNode(
        binaries={},
        net=NodeNetwork(7),
        root=tmp_path / "realnode",
        ca_cert=tmp_path / "ca.crt",
        kubelet_kubeconfig=tmp_path / "kubelet.kubeconfig",
        proxy_kubeconfig=tmp_path / "kube-proxy.kubeconfig",
        service_cidr="10.0.0.0/24",
    )


def test_addresses_follow_the_index() -> None:
    net = NodeNetwork(7)
    assert (net.netns, net.host_if, net.node_if) == ("ckpt-rn7", "ckrn7h", "ckrn7n")
    assert len(net.host_if) <= 15, "IFNAMSIZ"
    assert (net.host_ip, net.node_ip, net.pod_subnet, net.pod_gateway) == (
        "10.233.7.1",
        "10.233.7.2",
        "10.234.7.0/24",
        "10.234.7.1",
    )
    assert net.exec_argv(["kubelet"]) == ["nsenter", "--net=/run/netns/ckpt-rn7", "--", "kubelet"]


def test_containerd_keeps_everything_under_the_node_directory(tmp_path: Path) -> None:
    node = _node(tmp_path)
    config = tomllib.loads(node._containerd_config("localhost/ckpt-rollout-pause:x"))
    root = str(node.root)
    assert config["root"].startswith(root)
    assert config["state"].startswith(root)
    assert config["grpc"]["address"] == str(node.containerd_socket)
    assert "io.containerd.internal.v1.opt" in config["disabled_plugins"]  # would write /opt/containerd
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "localhost/ckpt-rollout-pause:x"
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["cni"]["conf_dir"].startswith(root)
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["Root"].startswith(root)
    assert runc["SystemdCgroup"] is False
    assert Path(runc["BinaryName"]).name == "runc-no-rlimits-oomscoreadj"


def test_cni_conflist_is_the_node_subnet(tmp_path: Path) -> None:
    node = _node(tmp_path)
    (node.root / "cni" / "net.d").mkdir(parents=True)
    node._write_cni()
    (conflist,) = (node.root / "cni" / "net.d").iterdir()
    body = json.loads(conflist.read_text())
    assert body["name"] == "ckpt-e2e-ckpt-rn7"
    (bridge,) = body["plugins"]
    assert (bridge["type"], bridge["bridge"], bridge["ipMasq"]) == ("bridge", "ckptbr0", False)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.234.7.0/24", "gateway": "10.234.7.1"}]]
    assert bridge["ipam"]["dataDir"].startswith(str(node.root))


def test_placement_targets_the_node_and_tolerates_its_taint() -> None:
    spec = placement()
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": NODE_NAME}
    assert spec["tolerations"] == [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]


def test_runc_wrapper_drops_rlimits_and_oom_score_adj(tmp_path: Path) -> None:
    """The wrapper edits the bundle, then execs runc with the same arguments: here `runc --help`
    after the bundle flag, which runc answers without touching the bundle."""
    wrapper = images.runtime_wrapper(("rlimits", "oomScoreAdj"))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {"process": {"args": ["sleep"], "rlimits": [{"type": "RLIMIT_NOFILE"}], "oomScoreAdj": 5}}
    (bundle / "config.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(wrapper), "--bundle", str(bundle), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "runc" in done.stdout + done.stderr
    assert json.loads((bundle / "config.json").read_text()) == {"process": {"args": ["sleep"]}}
