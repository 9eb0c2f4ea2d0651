"""Binary resolution order and failure messages (no Go build, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_e2e import provision, versions


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("CKPT_E2E_CACHE_DIR", str(cache))
    for name in versions.BINARIES:
        monkeypatch.delenv(provision.env_var_for(name), raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.delenv("CKPT_E2E_ALLOW_DOWNLOAD", raising=False)
    return cache


def test_explicit_path_beats_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _executable(provision.cached_path("etcd"))
    mine = _executable(tmp_path / "my-etcd")
    monkeypatch.setenv("CKPT_E2E_ETCD", str(mine))
    assert provision.resolve(["etcd"]) == {"etcd": mine}


def test_kubebuilder_assets_beat_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _executable(provision.cached_path("kube-apiserver"))
    assets = tmp_path / "assets"
    apiserver = _executable(assets / "kube-apiserver")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert provision.resolve(["kube-apiserver"]) == {"kube-apiserver": apiserver}


def test_cache_layout_is_version_directory(isolated: Path) -> None:
    cached = _executable(provision.cached_path("kwok"))
    assert cached == isolated / "bin" / versions.KWOK / "kwok"
    assert provision.resolve(["kwok"]) == {"kwok": cached}


def test_wrong_explicit_path_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    _executable(provision.cached_path("kubectl"))
    monkeypatch.setenv("CKPT_E2E_KUBECTL", "/nonexistent/kubectl")
    with pytest.raises(provision.ProvisionError, match="CKPT_E2E_KUBECTL"):
        provision.resolve(["kubectl"])


def test_missing_go_names_binary_step_and_retry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(provision.ProvisionError) as failed:
        provision.resolve(["helm"])
    message = str(failed.value)
    assert "helm" in message
    assert "`go` not found" in message
    assert "build" in message
    assert "provision.py helm" in message
    assert "CKPT_E2E_ALLOW_DOWNLOAD=1" in message


def test_unknown_binary_is_rejected() -> None:
    with pytest.raises(provision.ProvisionError, match="unknown"):
        provision.resolve(["kubeadm"])


def test_only_missing_binaries_of_a_component_are_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """kubelet and kube-proxy live in the control plane's wrapper module: a cache that has the
    control plane links only those two, not every binary of the module again."""
    k8s = versions.BINARIES["kubelet"]
    assert versions.BINARIES["kube-proxy"] is k8s is versions.BINARIES["kube-apiserver"]
    for name in k8s.packages:
        if name not in ("kubelet", "kube-proxy"):
            _executable(provision.cached_path(name))
    built: list[list[str]] = []

    def fake_go(cmd: list[str], cwd: Path, log: object, jobs: int = 1) -> str:
        if cmd[1] == "build":
            built.append([a for a in cmd if a.startswith("k8s.io/kubernetes/cmd/")])
            out = Path(cmd[cmd.index("-o") + 1])
            for pkg in built[-1]:
                _executable(out / provision._go_binary_name(pkg))
        return ""

    monkeypatch.setattr(provision, "_run_go", fake_go)
    monkeypatch.setattr(provision, "_wrapper_gomod", lambda component: "module x\n")
    monkeypatch.setattr("ckpt_e2e.provision.shutil.which", lambda name: "/usr/bin/go")
    found = provision.resolve(["kube-apiserver", "kubelet", "kube-proxy"])
    assert built == [["k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-proxy"]]
    assert found["kubelet"] == provision.cached_path("kubelet")
    assert provision.resolve(["kubelet", "kube-proxy"]) == {
        "kubelet": provision.cached_path("kubelet"),
        "kube-proxy": provision.cached_path("kube-proxy"),
    }
    assert len(built) == 1, "cached now"


def test_wrapper_replaces_every_published_staging_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    published = tmp_path / "kubernetes.mod"
    published.write_text(
        "module k8s.io/kubernetes\n\nreplace (\n"
        "\tk8s.io/api => ./staging/src/k8s.io/api\n"
        "\tk8s.io/streaming => ./staging/src/k8s.io/streaming\n"
        ")\n"
    )
    monkeypatch.setattr(provision, "_run_go", lambda *a, **k: json.dumps({"GoMod": str(published)}))
    k8s = versions.BINARIES["kube-apiserver"]
    gomod = provision._wrapper_gomod(k8s)
    staging = "v0" + versions.KUBERNETES[2:]
    assert f"k8s.io/api => k8s.io/api {staging}" in gomod
    assert f"k8s.io/streaming => k8s.io/streaming {staging}" in gomod
    assert f"require k8s.io/kubernetes {versions.KUBERNETES}" in gomod


@pytest.mark.parametrize(
    ("pkg", "binary"),
    [("go.etcd.io/etcd/server/v3", "server"), ("k8s.io/kubernetes/cmd/kubectl", "kubectl")],
)
def test_go_binary_name_skips_major_version_suffix(pkg: str, binary: str) -> None:
    assert provision._go_binary_name(pkg) == binary


def test_parallel_clusters_claim_disjoint_pod_cidrs() -> None:
    from ckpt_e2e.cluster import _claim_octets

    first, first_locks = _claim_octets(2)
    second, second_locks = _claim_octets(2)
    try:
        assert {first, first + 1}.isdisjoint({second, second + 1})
    finally:
        for lock in first_locks + second_locks:
            lock.close()


def test_a_module_without_staging_gets_a_plain_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace directives are for k8s.io/kubernetes's staging modules only: Prometheus's wrapper
    requires the published module and nothing else (no `go mod download` to read replaces)."""

    def no_go(*args: object, **kwargs: object) -> str:
        raise AssertionError(f"go run for a plain wrapper: {args}")

    monkeypatch.setattr(provision, "_run_go", no_go)
    gomod = provision._wrapper_gomod(versions.BINARIES["promtool"])
    assert f"require github.com/prometheus/prometheus {versions.PROMETHEUS}" in gomod
    assert "replace" not in gomod


def test_prometheus_and_promtool_share_one_component() -> None:
    component = versions.BINARIES["prometheus"]
    assert versions.BINARIES["promtool"] is component
    assert {provision._go_binary_name(p) for p in component.packages.values()} == {"prometheus", "promtool"}


@pytest.mark.parametrize(("module_version", "release"), [("v0.316.0", "3.16.0"), ("v0.300.1", "3.0.1")])
def test_prometheus_module_tags_map_to_releases(module_version: str, release: str) -> None:
    assert versions.prometheus_release(module_version) == release


def test_prometheus_download_names_the_release_tarball_member() -> None:
    release = versions.prometheus_release(versions.PROMETHEUS)
    url, member, _ = provision._release_urls(versions.BINARIES["promtool"], "promtool")
    assert url.endswith(f"/v{release}/prometheus-{release}.linux-{provision._ARCH}.tar.gz")
    assert member == f"prometheus-{release}.linux-{provision._ARCH}/promtool"
