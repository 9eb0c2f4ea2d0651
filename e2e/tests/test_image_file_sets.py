"""Each image's exact file set, installed into a clean venv, runs its entrypoint.

The operator image once crash-looped because its CLI imported agent code the image does not copy.
These tests copy what each Dockerfile COPYs (read from the Dockerfile), `pip install` it with the
image's extra and constraints.txt into a fresh venv with no access to this checkout, and run the
image's ENTRYPOINT with `--help` and with one real command. The images themselves are built and run
in test_images.py; this tier pins the Python packaging without a container runtime.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_e2e.dockerfile import copy_file_set, entrypoint
from ckpt_e2e.procs import spawn_server

# Each fixture builds a venv from the image's file set (pip, minutes cold): the images tier.
pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml"


class Venv:
    def __init__(self, path: Path, src: Path) -> None:
        self.path = path
        self.src = src

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def run(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        # A clean environment: nothing of this checkout (PYTHONPATH, the dev venv) leaks in.
        env = {"PATH": f"{self.path / 'bin'}:/usr/bin:/bin", "HOME": str(self.path)}
        return subprocess.run(
            argv, cwd=self.path, env=env, capture_output=True, text=True, timeout=120, check=False, **kwargs
        )  # type: ignore[call-overload, no-any-return]

    def command(self, dockerfile: Path) -> list[str]:
        """The image's ENTRYPOINT resolved against this venv's bin/."""
        first, *rest = entrypoint(dockerfile)
        return [self.bin("python" if first in ("python", "python3") else first), *rest]


def _install(tmp: Path, dockerfile: Path, extra: str) -> Venv:
    src = tmp / "src"
    copy_file_set(dockerfile, ROOT, src)
    venv = Venv(tmp / "venv", src)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv.path)], check=True)
    # uv resolves and installs the same requirements as the Dockerfile's pip, from a warm cache in
    # seconds; what is under test is the file set and the extra, not the installer.
    uv = str(Path(sys.executable).parent / "uv")
    proc = subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", venv.bin("python"), "-c", str(src / "constraints.txt"),
         f"{src}[{extra}]"],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"pip install of {dockerfile.name}'s file set failed:\n{proc.stderr[-3000:]}"
    return venv


@pytest.fixture(scope="module")
def operator_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return _install(tmp_path_factory.mktemp("operator-image"), ROOT / "operator" / "Dockerfile", "operator")


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    # The slim worker image: the agent extra only (no paddle, no mooncake).
    return _install(tmp_path_factory.mktemp("worker-image"), ROOT / "worker_image" / "Dockerfile", "agent")


def _installed_packages(venv: Venv) -> set[str]:
    code = "import pkgutil; print(' '.join(sorted(m.name for m in pkgutil.iter_modules())))"
    return set(venv.run([venv.bin("python"), "-c", code]).stdout.split())


def test_operator_file_set_holds_no_agent_bench_or_harness(operator_venv: Venv) -> None:
    modules = _installed_packages(operator_venv)
    assert {"ckpt_api", "ckpt_rollout"} <= modules
    assert not modules & {"ckpt_agent", "ckpt_e2e", "paddle", "mooncake"}, modules
    site = operator_venv.run([operator_venv.bin("python"), "-c", "import ckpt_api; print(ckpt_api.__file__)"])
    api_dir = Path(site.stdout.strip()).parent
    assert not (api_dir / "testdata.py").exists()  # test data left the wheel


def test_operator_entrypoint_help(operator_venv: Venv) -> None:
    proc = operator_venv.run([*operator_venv.command(ROOT / "operator" / "Dockerfile"), "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "--agent-token-file" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_operator_real_commands(operator_venv: Venv) -> None:
    crd = operator_venv.run([operator_venv.bin("ckpt-rollout"), "crd"])
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == CRD.read_text()
    # A user command with no cluster configured: a clear error, not a crash on a missing module.
    status = operator_venv.run([operator_venv.bin("ckpt-rollout"), "status", "fleet", "-n", "rl"])
    assert "ModuleNotFoundError" not in status.stderr
    assert status.returncode != 0
    # A command of a group the image lacks names what to install.
    agent = operator_venv.run([operator_venv.bin("ckpt-rollout"), "agent", "--help"])
    assert agent.returncode == 2
    assert "ckpt-rollout[agent]" in agent.stderr
    assert "Traceback" not in agent.stderr
    # The trainer's client imports without the agent; only publishing needs it, and says so
    # before anything is read or written.
    imported = operator_venv.run(
        [
            operator_venv.bin("python"),
            "-c",
            "from ckpt_rollout.tools.client import release, set_target_version, wait_for",
        ]
    )
    assert imported.returncode == 0, imported.stderr
    release = operator_venv.run(
        [operator_venv.bin("ckpt-rollout"), "release", "v2", "--from", ".", "--rollout", "fleet", "-n", "rl"]
    )
    assert release.returncode == 2, release.stderr
    assert "ckpt-rollout[agent]" in release.stderr
    assert "Traceback" not in release.stderr


def test_agent_file_set_holds_no_operator_or_harness(agent_venv: Venv) -> None:
    modules = _installed_packages(agent_venv)
    assert {"ckpt_api", "ckpt_agent"} <= modules
    assert not modules & {"ckpt_rollout", "ckpt_e2e", "kopf", "paddle", "mooncake"}, modules


def test_agent_entrypoint_help(agent_venv: Venv) -> None:
    proc = agent_venv.run([*agent_venv.command(ROOT / "worker_image" / "Dockerfile"), "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "--engine" in proc.stdout


def test_agent_file_set_runs_ckpt_rollout_with_the_agents_commands(agent_venv: Venv) -> None:
    """The worker image's `ckpt-rollout` script has its module (ckpt_cli) and mounts the agent's
    commands; the operator's say what to install."""
    usage = agent_venv.run([agent_venv.bin("ckpt-rollout"), "--help"])
    assert usage.returncode == 0, usage.stderr
    for command in ("crd", "publish", "serve", "agent"):
        assert command in usage.stdout
    status = agent_venv.run([agent_venv.bin("ckpt-rollout"), "status", "fleet"])
    assert status.returncode == 2, status.stderr
    assert "ckpt-rollout[operator]" in status.stderr
    assert "Traceback" not in status.stderr


@pytest.fixture
def running_agent(agent_venv: Venv, tmp_path: Path) -> Iterator[tuple[str, str]]:
    token = "file-set-test-token"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    flags = [
        "--engine",
        "null",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        # No separate metrics listener: its default port (8090) is fixed, so shared machine-wide.
        "--metrics-port",
        "0",
        "--auth-token-file",
        str(token_file),
        "--plain-http",
    ]
    argv = [*agent_venv.command(ROOT / "worker_image" / "Dockerfile"), *flags]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc, url = spawn_server(argv, tmp_path / "agent.log", "slim agent", env=env, timeout=30)
    try:
        yield url, token
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_agent_entrypoint_serves_the_control_api(running_agent: tuple[str, str]) -> None:
    url, token = running_agent
    req = urllib.request.Request(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
        body = resp.read().decode()
    assert '"state"' in body
    unauthenticated = urllib.request.Request(f"{url}/v1/status")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(unauthenticated, timeout=5)
    assert err.value.code == 401


def test_paddle_engine_without_paddle_says_what_to_install(agent_venv: Venv) -> None:
    proc = agent_venv.run(
        [
            *agent_venv.command(ROOT / "worker_image" / "Dockerfile"),
            "--engine",
            "paddle",
            "--no-auth",
            "--plain-http",
        ]
    )
    assert proc.returncode != 0
    assert "ckpt-rollout[paddle]" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
