"""The images users deploy, built here from their Dockerfiles (buildah, a Debian-bootstrapped
Python base) and run the way the chart runs them (podman: the image's non-root user, read-only
root filesystem, no capabilities, no privilege escalation, tmpfs /tmp)."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ckpt_e2e import images
from ckpt_e2e.dockerfile import copied_sources
from ckpt_e2e.images import Built, Container
from ckpt_e2e.launchers import ContainerLauncher
from ckpt_e2e.procs import PortReservation, spawn, stop, wait_for

# A cold build of every image takes minutes (paddle alone is ~1 GB installed); the session
# fixture that builds them runs inside the first test's timeout.
pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml"
OPERATOR_UID = "65532:65532"  # the chart's runAsUser/runAsGroup
WORKER_UID = "10001:10001"  # the worker image's USER
WORKERS = ("worker-cpu", "worker-slim")
PEM = re.compile(r"-----BEGIN CERTIFICATE-----\s+(.*?)-----END CERTIFICATE-----", re.S)


def _operator(built: dict[str, Built], name: str, entrypoint: list[str] | None = None) -> Container:
    return Container(built["operator"].tag, name, user=OPERATOR_UID, entrypoint=entrypoint)


def _python_in(built: Built, name: str, code: str) -> dict[str, object]:
    """Run `code` with the image's own interpreter, as its user; returns the JSON it prints."""
    result = Container(built.tag, name, entrypoint=["python", "-c", code]).run()
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return found


# -- building ---------------------------------------------------------------------------------------


def test_every_image_builds_and_reports_its_size(
    built_images: dict[str, Built], record_property: Callable[[str, object], None]
) -> None:
    for built in built_images.values():
        record_property(f"{built.name}_size_mb", round(built.size_bytes / 1e6))
        record_property(f"{built.name}_seconds", round(built.seconds, 1))
        print(f"images: {built.summary()}")
    sizes = {name: b.size_bytes for name, b in built_images.items()}
    assert set(sizes) == {"base", *images.IMAGES}
    # Each image is its base plus what it installs; paddle and Mooncake are what cpu adds to slim.
    assert sizes["base"] < sizes["operator"]
    assert sizes["base"] < sizes["worker-slim"] < sizes["worker-cpu"]


@pytest.mark.parametrize("name", list(images.IMAGES))
def test_build_context_holds_only_what_the_dockerfile_copies(
    built_images: dict[str, Built], name: str
) -> None:
    spec = images.IMAGES[name]
    context = images.build_context(spec)
    sources = copied_sources(ROOT / spec.dockerfile)

    def copied(path: str) -> bool:
        return any(path == s or path.startswith(f"{s}/") for s in sources)

    assert sorted(p for p in context.files if not copied(p)) == []
    assert sorted(s for s in sources if not any(p == s or p.startswith(f"{s}/") for p in context.files)) == []
    assert not [p for p in context.files if "__pycache__" in p or p.endswith(".pyc")]
    print(f"images: {name} context: {len(context.files)} files, {context.total_bytes / 1e6:.2f} MB")
    assert context.total_bytes < 5_000_000


def test_unchanged_inputs_are_not_rebuilt(built_images: dict[str, Built]) -> None:
    started = time.monotonic()
    again = images.build_all()
    seconds = time.monotonic() - started
    print(f"images: cached re-run of every image in {seconds:.1f}s")
    for built in again:
        assert built.cached, built.name
        assert built.image_id == built_images[built.name].image_id


# -- what is (not) in the images --------------------------------------------------------------------


def _pem_bodies(text: str) -> set[str]:
    return {re.sub(r"\s+", "", body) for body in PEM.findall(text)}


def _signature_line(body: str) -> str:
    """The last full 64-character line of a PEM body: it lies in the signature, which differs
    even between re-issues of one CA (same key, same subject) that the bundles may hold."""
    last = len(body) // 64 - 1
    return body[64 * last : 64 * (last + 1)]


def _host_only_certs(base_root: Path, image_root: Path, host_bundle: Path) -> set[str]:
    """CA certificates the host trusts that no bundle of the image's own comes with: the gateway's,
    which the build saw through its CA mount and which must not have stayed."""
    public = _pem_bodies((base_root / images.BUILD_CA_PATH.lstrip("/")).read_text())
    for bundle in image_root.rglob("cacert.pem"):  # certifi and its vendored copies
        public |= _pem_bodies(bundle.read_text(errors="replace"))
    return _pem_bodies(host_bundle.read_text()) - public


@pytest.mark.parametrize("name", list(images.IMAGES))
def test_build_time_ca_and_pip_config_do_not_reach_the_image(
    built_images: dict[str, Built], name: str
) -> None:
    built = built_images[name]
    info = images.inspect_image(built.tag)
    env = dict(e.split("=", 1) for e in info["Config"].get("Env") or [])
    assert [k for k in env if k.startswith("PIP_") or "CERT" in k or "CA_BUNDLE" in k] == []
    history = " ".join(str(row.get("CreatedBy", "")) for row in images.image_history(built.tag))
    for needle in (images.BUILD_CA_PATH, "pip.conf", "PIP_CERT", str(images.images_dir())):
        assert needle not in history

    host_bundle = images.host_ca_bundle()
    with images.mounted_image(built_images["base"].tag) as base_root, images.mounted_image(built.tag) as root:
        confs = ["etc/pip.conf", "etc/xdg/pip/pip.conf", "root/.config/pip/pip.conf", "root/.pip/pip.conf"]
        confs += [str(p.relative_to(root)) for p in root.glob("opt/*/pip.conf")]
        # A pip.conf mount (only when the host uses another index) leaves its empty mount point.
        assert [c for c in confs if (root / c).exists() and (root / c).stat().st_size] == []
        if not images.pip_index_settings(images.host_pip_settings()):
            assert [c for c in confs if (root / c).exists()] == []
        image_bundle = root / images.BUILD_CA_PATH.lstrip("/")
        assert image_bundle.read_bytes() == (base_root / images.BUILD_CA_PATH.lstrip("/")).read_bytes()
        if host_bundle is None:
            return
        private = _host_only_certs(base_root, root, host_bundle)
        patterns = "\n".join(_signature_line(body) for body in private)
        if patterns:
            found = subprocess.run(
                ["grep", "-rlF", "-e", patterns, str(root)], capture_output=True, text=True, check=False
            )
            assert found.stdout.strip() == "", f"host-only CA certificates in {name}: {found.stdout}"
        host_size = host_bundle.stat().st_size
        host_bytes = host_bundle.read_bytes()
        copies = [
            p
            for p in root.rglob("*")
            if p.is_file()
            and not p.is_symlink()
            and p.stat().st_size == host_size
            and p.read_bytes() == host_bytes
        ]
        assert copies == []
    print(f"images: {name}: no build CA, pip config or host-only certificate ({len(private)} checked)")


@pytest.mark.parametrize("name", list(images.IMAGES))
def test_no_bench_tools_in_production_images(built_images: dict[str, Built], name: str) -> None:
    with images.mounted_image(built_images[name].tag) as root:
        assert [p for p in ("bin/ip", "sbin/ip", "usr/bin/ip", "usr/sbin/ip") if (root / p).exists()] == []
        installed = re.findall(r"^Package: (\S+)$", (root / "var/lib/dpkg/status").read_text(), re.M)
        assert "iproute2" not in installed


def test_paddle_and_mooncake_only_where_asked_for(built_images: dict[str, Built]) -> None:
    # Importing them (not only finding them) catches a missing system library (libgomp, libcurl).
    code = (
        "import importlib, importlib.util, json\n"
        "def probe(mod):\n"
        "    if importlib.util.find_spec(mod.split('.')[0]) is None:\n"
        "        return 'absent'\n"
        "    importlib.import_module(mod)\n"
        "    return 'imports'\n"
        "mods = ('paddle', 'mooncake.engine', 'ckpt_agent.cli', 'ckpt_source.publish')\n"
        "print(json.dumps({m: probe(m) for m in mods}))\n"
    )
    cpu = _python_in(built_images["worker-cpu"], "ckpt-e2e-probe-cpu", code)
    slim = _python_in(built_images["worker-slim"], "ckpt-e2e-probe-slim", code)
    ours = {"ckpt_agent.cli": "imports", "ckpt_source.publish": "imports"}
    assert cpu == {"paddle": "imports", "mooncake.engine": "imports", **ours}
    assert slim == {"paddle": "absent", "mooncake.engine": "absent", **ours}


# -- the operator image -----------------------------------------------------------------------------


def test_operator_image_runs_as_the_chart_runs_it(built_images: dict[str, Built]) -> None:
    config = images.inspect_image(built_images["operator"].tag)["Config"]
    assert config["User"] == OPERATOR_UID
    assert config["Entrypoint"] == ["ckpt-rollout", "operator"]
    result = _operator(built_images, "ckpt-e2e-operator-help").run(["--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ckpt-rollout operator")
    assert "--agent-token-file" in result.stdout


def test_operator_image_user_commands(built_images: dict[str, Built]) -> None:
    cli = _operator(built_images, "ckpt-e2e-operator-cli", entrypoint=["ckpt-rollout"])
    crd = cli.run(["crd"])
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == CRD_FILE.read_text()
    usage = cli.run(["--help"])
    assert usage.returncode == 0, usage.stderr
    for command in ("operator", "crd", "status", "watch", "promote"):
        assert command in usage.stdout
    # No publisher here: a release with a checkpoint to publish says what to install, before
    # it looks for a cluster.
    publish = cli.run(["release", "v2", "--rollout", "fleet", "--from", "/tmp", "--publish-root", "/tmp"])
    assert publish.returncode == 2, publish.stderr
    assert "checkpoint publisher (ckpt_source)" in publish.stderr


# -- the worker images ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WORKERS)
def test_worker_image_entrypoint_is_the_agent(built_images: dict[str, Built], name: str) -> None:
    config = images.inspect_image(built_images[name].tag)["Config"]
    assert config["User"] == WORKER_UID
    assert config["Entrypoint"] == ["python", "-m", "ckpt_agent", "agent"]
    result = Container(built_images[name].tag, f"ckpt-e2e-{name}-help").run(["--help"])
    assert result.returncode == 0, result.stderr
    assert "--engine" in result.stdout
    tools = Container(
        built_images[name].tag, f"ckpt-e2e-{name}-tools", entrypoint=["python", "-m", "ckpt_agent"]
    )
    for command in ("publish", "serve"):
        usage = tools.run([command, "--help"])
        assert usage.returncode == 0, usage.stderr
        assert usage.stdout.startswith("usage:")
    # The image's `ckpt-rollout` script runs (its module, ckpt_cli, is in the image) and mounts
    # the agent's commands.
    cli = Container(built_images[name].tag, f"ckpt-e2e-{name}-cli", entrypoint=["ckpt-rollout"])
    usage = cli.run(["--help"])
    assert usage.returncode == 0, usage.stderr
    for command in ("crd", "publish", "serve", "agent"):
        assert command in usage.stdout


def _get(url: str, token: str | None = None) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"agent exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return _get(f"{url}/healthz")[0] == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _loopback_agent_flags(port: int) -> list[str]:
    """An agent on a loopback port of the host network, plain http (these tests are about the
    image, not TLS), no separate metrics port (the default one would collide between containers)."""
    return ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0", "--plain-http"]


@contextmanager
def _agent_container(built: Built, args: list[str], token_file: Path, log: Path) -> Iterator[str]:
    """The worker image's agent on a loopback port of the host network; yields its base URL."""
    held = PortReservation(1)  # held while the container runs: see PortReservation
    (port,) = held.ports
    flags = [
        *_loopback_agent_flags(port),
        "--auth-token-file",
        str(token_file),
        *args,
    ]
    launch = ContainerLauncher(built.tag).launch(flags, built.name, {}, [token_file])
    proc = spawn(launch.argv, log, env=launch.env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url, proc, log), 120, f"{built.name} agent /healthz", interval=0.3)
        yield url
    finally:
        code = stop(proc, grace=15)
        assert launch.cleanup is not None
        launch.cleanup()
        held.release()
    assert code == 0, f"agent did not stop cleanly on SIGTERM (exit {code}):\n{log.read_text()[-3000:]}"


@pytest.mark.parametrize(
    ("name", "engine_args"),
    [
        ("worker-cpu", ["--engine", "paddle"]),
        # The slim image's engines talk HTTP to a separate server; none runs here, which the
        # agent only needs at load time.
        (
            "worker-slim",
            ["--engine", "sglang", "--engine-url", "http://127.0.0.1:9", "--staging-dir", "/tmp/s"],
        ),
    ],
)
def test_worker_image_serves_the_agent_api(
    built_images: dict[str, Built], name: str, engine_args: list[str], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("image-test-token")
    with _agent_container(built_images[name], engine_args, token_file, tmp_path / "agent.log") as url:
        assert _get(f"{url}/healthz") == (200, {"ok": True})
        code, status = _get(f"{url}/v1/status", token="image-test-token")
        assert code == 200
        assert status["state"] == "idle"
        assert isinstance(status["engine"], dict)
        assert status["engine"]["name"] == engine_args[1]
        assert _get(f"{url}/v1/status")[0] == 401
        assert _get(f"{url}/v1/status", token="wrong")[0] == 401


def test_slim_worker_refuses_the_paddle_engine_with_a_hint(built_images: dict[str, Built]) -> None:
    result = Container(built_images["worker-slim"].tag, "ckpt-e2e-slim-paddle").run(
        ["--engine", "paddle", "--no-auth", "--plain-http"]
    )
    assert result.returncode == 2
    assert "needs paddle" in result.stderr


def test_a_killed_container_is_gone_after_cleanup(built_images: dict[str, Built], tmp_path: Path) -> None:
    """`Launch.kill` is SIGKILL to the container's process (the podman client is only a viewer),
    and `cleanup` leaves no container behind: what OperatorProcess.kill and PodRuntime rely on."""
    built = built_images["worker-slim"]
    held = PortReservation(1)
    (port,) = held.ports
    args = [
        *_loopback_agent_flags(port),
        "--engine",
        "null",
        "--no-auth",
    ]
    launch = ContainerLauncher(built.tag).launch(args, "kill-probe", {}, [])
    log = tmp_path / "agent.log"
    proc = spawn(launch.argv, log, env=launch.env)
    try:
        wait_for(lambda: _healthy(f"http://127.0.0.1:{port}", proc, log), 60, "agent /healthz", interval=0.3)
        assert len(images.containers(built.tag)) == 1
        assert launch.kill is not None
        launch.kill()
        assert proc.wait(timeout=30) == 128 + 9  # podman reports the container's SIGKILL
    finally:
        stop(proc)
        held.release()
        assert launch.cleanup is not None
        launch.cleanup()
    assert images.containers(built.tag) == []
