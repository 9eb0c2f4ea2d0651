"""Build the operator and worker images from their Dockerfiles and run them, without a Docker
engine or a registry (test harness only; nothing here ships).

- Base: a Debian root filesystem bootstrapped from packages with mmdebstrap (python3,
  python3-venv, ca-certificates), cached as a tarball under ``<cache>/images/`` keyed by its
  package list, and ``podman import``-ed as ``localhost/ckpt-rollout-base:<suite>-<key>``. The
  Dockerfiles take it through their ``PYTHON_IMAGE`` build arg (the official python image stays
  their default).
- Build: ``buildah bud --isolation chroot --layers`` with the Dockerfile's own ignore file. The
  machine reaches package registries through a TLS gateway whose CA only the host trusts, so the
  host's CA bundle (and, when the host's pip uses another index, a pip.conf naming it) are
  bind-mounted for the build's RUN steps only: no ENV, ARG or file of the image refers to them.
- Skip: each image carries a label with a hash of its exact inputs (Dockerfile, ignore file,
  every file of the build context as buildah sends it, build args, base image id); an image whose
  label matches is not rebuilt.
- Run: podman needs two workarounds on these VMs: the cgroupfs cgroup manager (cgroup v1+v2
  hybrid), and an OCI runtime wrapper that drops ``process.rlimits`` from the bundle (setting
  rlimits on the container's process is refused here) before exec'ing runc.

CLI: ``python -m ckpt_e2e.images build [--all | operator | worker-cpu | worker-slim ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import pid_alive
from .provision import cache_root, file_lock

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_TOOLS = ("podman", "buildah", "mmdebstrap", "runc")
INSTALL_HINT = "install them with `bash scripts/install-system-deps.sh images` (Debian/Ubuntu)"
INPUTS_LABEL = "dev.ckpt.rollout.e2e.inputs"
OWNER_LABEL = "dev.ckpt.rollout.e2e.owner"
# Where the build's RUN steps had host files mounted. buildah's layer cache ignores mounts, and a
# mount at a new path leaves its mount point in the layer, so a different set means no cache.
MOUNTS_LABEL = "dev.ckpt.rollout.e2e.build-mounts"
# Bumped when this module changes how an image is built from the same inputs.
RECIPE = "2"
# Where the host's CA bundle appears during RUN steps: over Debian's bundle, so every TLS client
# in the build trusts it (Debian's pip reads the system bundle, not a vendored certifi), and the
# image's own copy is untouched underneath. A mount over an existing file leaves no trace in the
# layer; one at a new path leaves an empty mount point behind, hence no pip.conf unless needed.
BUILD_CA_PATH = "/etc/ssl/certs/ca-certificates.crt"
BUILD_PIP_CONF = "/etc/pip.conf"
# Host pip settings a build needs: where packages come from. Only these make a pip.conf mount
# (tuning such as timeouts does not justify the mount point it leaves); `cert` picks the CA file.
_PIP_INDEX_KEYS = ("index-url", "extra-index-url", "trusted-host")
_PIP_KEYS = (*_PIP_INDEX_KEYS, "cert")


class ImageError(RuntimeError):
    """A tool is missing or a step failed; the message says which and where its log is."""


def images_dir() -> Path:
    return cache_root() / "images"


def require_tools() -> dict[str, Path]:
    found = {name: shutil.which(name) for name in REQUIRED_TOOLS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise ImageError(f"missing {', '.join(missing)}: {INSTALL_HINT}")
    return {name: Path(path) for name, path in found.items() if path is not None}


# -- base root filesystem -------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseSpec:
    suite: str = "bookworm"  # its python3 is 3.11, the version the official default base has
    variant: str = "minbase"
    packages: tuple[str, ...] = ("ca-certificates", "python3", "python3-venv")

    @property
    def key(self) -> str:
        recipe = {"suite": self.suite, "variant": self.variant, "packages": sorted(self.packages)}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"localhost/ckpt-rollout-base:{self.suite}-{self.key}"

    @property
    def tarball(self) -> Path:
        return images_dir() / f"base-{self.suite}-{self.key}.tar"


@dataclass
class Built:
    name: str
    tag: str
    image_id: str
    size_bytes: int
    seconds: float
    cached: bool
    log: Path | None = None

    def summary(self) -> str:
        how = "cached" if self.cached else f"built in {self.seconds:.1f}s"
        return f"{self.name}: {self.tag} {self.size_bytes / 1e6:.0f} MB ({how})"


def _run(argv: Sequence[str | os.PathLike[str]], log: Path | None = None, timeout: float = 1800) -> str:
    """Run a tool; its output goes to `log` (appended) or is returned. Failures name the log.
    `timeout` bounds a cold build (paddle's wheels are ~200 MB), not a normal step."""
    args = [str(a) for a in argv]
    try:
        return _run_once(args, log, timeout)
    except subprocess.TimeoutExpired as exc:
        where = f"; log {log}" if log is not None else ""
        raise ImageError(f"{' '.join(args[:2])} ran past {timeout:.0f}s{where}") from exc


def _run_once(args: list[str], log: Path | None, timeout: float) -> str:
    if log is None:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ImageError(f"{' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    code = done.returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise ImageError(f"{args[0]} {args[1]} failed (exit {code}); log {log}:\n{tail}")
    return ""


def _lock(name: str) -> contextlib.AbstractContextManager[None]:
    """One builder per image across processes (make images and a pytest run may race)."""
    return file_lock(images_dir() / "locks" / f"{name}.lock")


def image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0


def inspect_image(tag: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(_run(["podman", "image", "inspect", tag]))
    return found[0]


def image_history(tag: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        _run(["podman", "history", "--no-trunc", "--format", "json", tag])
    )
    return rows


def ensure_base(spec: BaseSpec | None = None) -> Built:
    """The base image: imported from the cached tarball, bootstrapped first if there is none."""
    spec = spec or BaseSpec()
    require_tools()
    started = time.monotonic()
    log = images_dir() / "logs" / "base.log"
    with _lock("base"):
        cached = image_exists(spec.tag)
        if not cached:
            if not spec.tarball.exists():
                _bootstrap(spec, log)
            # The bootstrapped rootfs has no image config; give it what an official python image
            # has, so Dockerfile RUN steps and ENV PATH=...:$PATH behave the same on both.
            _run(
                [
                    "podman",
                    "import",
                    "--change",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--change",
                    "ENV LANG=C.UTF-8",
                    "--change",
                    'CMD ["python3"]',
                    spec.tarball,
                    spec.tag,
                ],
                log,
            )
    info = inspect_image(spec.tag)
    return Built("base", spec.tag, info["Id"], int(info["Size"]), time.monotonic() - started, cached, log)


def _bootstrap(spec: BaseSpec, log: Path) -> None:
    spec.tarball.parent.mkdir(parents=True, exist_ok=True)
    # Written next to its final name and renamed: an interrupted bootstrap leaves no tarball that
    # a later run would take for a good one.
    partial = spec.tarball.with_suffix(".partial.tar")
    partial.unlink(missing_ok=True)
    _run(
        [
            "mmdebstrap",
            f"--variant={spec.variant}",
            f"--include={','.join(spec.packages)}",
            spec.suite,
            partial,
        ],
        log,
    )
    partial.rename(spec.tarball)


# -- images -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSpec:
    name: str
    tag: str
    dockerfile: str  # relative to the repository root, which is the build context
    build_args: Mapping[str, str] = field(default_factory=dict)

    @property
    def ignorefile(self) -> str:
        # BuildKit's convention, which bookworm's buildah also follows; passed explicitly anyway
        # so the context this module hashes is the context buildah sends.
        return f"{self.dockerfile}.dockerignore"


IMAGES: dict[str, ImageSpec] = {
    spec.name: spec
    for spec in (
        ImageSpec("operator", "localhost/ckpt-rollout-operator:local", "operator/Dockerfile"),
        ImageSpec(
            "worker-cpu",
            "localhost/ckpt-rollout-worker:cpu",
            "worker_image/Dockerfile",
            {"PADDLE": "cpu", "MOONCAKE": "cpu"},
        ),
        ImageSpec(
            "worker-slim",
            "localhost/ckpt-rollout-worker:slim",
            "worker_image/Dockerfile",
            {"PADDLE": "none", "MOONCAKE": "none"},
        ),
    )
}


@dataclass(frozen=True)
class Context:
    files: Mapping[str, str]  # path -> sha256 (mode included), as buildah sends them
    total_bytes: int


def build_context(spec: ImageSpec, root: Path = ROOT) -> Context:
    """The files buildah sends for `spec`: found by building a FROM-scratch probe that copies the
    whole context with the same ignore file, so no re-implementation of .dockerignore rules can
    drift from buildah's."""
    probe_tag = f"localhost/ckpt-rollout-context-probe:{os.getpid()}-{spec.name}"
    with tempfile.TemporaryDirectory(prefix="ckpt-context-") as tmp:
        probe = Path(tmp) / "Containerfile"
        probe.write_text("FROM scratch\nCOPY . /context/\n")
        _run(
            [
                "buildah",
                "bud",
                "--quiet",
                "--ignorefile",
                root / spec.ignorefile,
                "-f",
                probe,
                "-t",
                probe_tag,
                root,
            ]
        )
    try:
        with mounted_image(probe_tag) as rootfs:
            base = rootfs / "context"
            files: dict[str, str] = {}
            total = 0
            for path in sorted(base.rglob("*")):
                if path.is_dir() and not path.is_symlink():
                    continue
                rel = path.relative_to(base).as_posix()
                data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
                mode = path.lstat().st_mode
                files[rel] = hashlib.sha256(f"{mode:o}:".encode() + data).hexdigest()
                total += len(data)
    finally:
        _run(["buildah", "rmi", "--force", probe_tag])
    return Context(files, total)


@contextlib.contextmanager
def mounted_image(tag: str) -> Iterator[Path]:
    """The image's root filesystem, read-only, for inspection (needs root, as podman here runs)."""
    path = Path(_run(["podman", "image", "mount", tag]).strip())
    try:
        yield path
    finally:
        _run(["podman", "image", "unmount", tag])


def input_hash(spec: ImageSpec, base: Built, context: Context, mounts: str, root: Path = ROOT) -> str:
    inputs = {
        "recipe": RECIPE,
        "mounts": mounts,
        "dockerfile": hashlib.sha256((root / spec.dockerfile).read_bytes()).hexdigest(),
        "ignorefile": hashlib.sha256((root / spec.ignorefile).read_bytes()).hexdigest(),
        "context": dict(context.files),
        "build_args": dict(sorted(_build_args(spec, base).items())),
        "base": base.image_id,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _build_args(spec: ImageSpec, base: Built) -> dict[str, str]:
    return {"PYTHON_IMAGE": base.tag, **spec.build_args}


def host_ca_bundle() -> Path | None:
    """The CA file the host's pip trusts: its `cert` setting, else the system default bundle."""
    configured = host_pip_settings().get("cert")
    candidates = [configured] if configured else []
    defaults = ssl.get_default_verify_paths()
    candidates += [defaults.cafile, defaults.openssl_cafile, BUILD_CA_PATH]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def host_pip_settings() -> dict[str, str]:
    """The host's effective pip settings (config files and PIP_* variables) that matter to a build."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    settings: dict[str, str] = {}
    # Lines look like `global.cert='/path'` or `:env:.cert='/path'`; later lines (env) override.
    for match in re.finditer(r"^[^.\n]*\.([a-z-]+)='(.*)'$", proc.stdout, re.M):
        key, value = match.group(1), match.group(2)
        if key in _PIP_KEYS:
            settings[key] = value
    return settings


def pip_index_settings(pip_settings: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in pip_settings.items() if k in _PIP_INDEX_KEYS}


def build_mounts(ca: Path | None, pip_settings: Mapping[str, str]) -> list[str]:
    """`-v` values for a build: the host's CA over the base's bundle and, only when the host
    takes packages from another index, a pip.conf saying which (and trusting that CA)."""
    mounts = [] if ca is None else [f"{ca.resolve()}:{BUILD_CA_PATH}:ro"]
    if index := pip_index_settings(pip_settings):
        if ca is not None:
            index["cert"] = BUILD_CA_PATH
        path = images_dir() / "build-config" / "pip.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(index.items())))
        path.chmod(0o600)  # an index URL may carry credentials
        mounts.append(f"{path}:{BUILD_PIP_CONF}:ro")
    return mounts


def build(spec: ImageSpec, base: Built | None = None, force: bool = False) -> Built:
    """Build `spec` unless an image with the same inputs exists; returns its tag, id and size."""
    require_tools()
    base = base or ensure_base()
    started = time.monotonic()
    log = images_dir() / "logs" / f"{spec.name}.log"
    with _lock(spec.name):
        mounts = build_mounts(host_ca_bundle(), host_pip_settings())
        # Named by kind, not path: the image keeps no reference to where the CA was.
        kinds = {BUILD_CA_PATH: "ca", BUILD_PIP_CONF: "pip-index"}
        targets = ",".join(sorted(kinds[m.split(":")[1]] for m in mounts))
        context = build_context(spec)
        digest = input_hash(spec, base, context, targets)
        labels: dict[str, str] = {}
        previous: str | None = None
        if image_exists(spec.tag):
            info = inspect_image(spec.tag)
            labels, previous = info.get("Labels") or {}, info["Id"]
            if not force and labels.get(INPUTS_LABEL) == digest:
                info = inspect_image(spec.tag)
                seconds = time.monotonic() - started
                return Built(spec.name, spec.tag, info["Id"], int(info["Size"]), seconds, True, log)
        log.unlink(missing_ok=True)
        argv: list[str | os.PathLike[str]] = [
            "buildah",
            "bud",
            "--isolation",
            "chroot",
            "--layers",
            # Docker's format: OCI image configs have no HEALTHCHECK, and Docker users get this one.
            "--format",
            "docker",
            "--pull=never",  # the base is local; a registry is never asked
            "-f",
            ROOT / spec.dockerfile,
            "--ignorefile",
            ROOT / spec.ignorefile,
            "-t",
            spec.tag,
            "--label",
            f"{INPUTS_LABEL}={digest}",
            "--label",
            f"{MOUNTS_LABEL}={targets}",
        ]
        if force or labels.get(MOUNTS_LABEL) != targets:
            argv.append("--no-cache")
        for key, value in _build_args(spec, base).items():
            argv += ["--build-arg", f"{key}={value}"]
        for mount in mounts:
            argv += ["-v", mount]
        _run([*argv, ROOT], log)
        info = inspect_image(spec.tag)
        if previous is not None and previous != info["Id"]:
            _remove_abandoned(previous)
    return Built(spec.name, spec.tag, info["Id"], int(info["Size"]), time.monotonic() - started, False, log)


def _remove_abandoned(image_id: str) -> None:
    """Remove the image a rebuild untagged and then each parent left without tags and children:
    the previous build's own layers (a worker image's are ~1 GB). Steps the new build reused
    have children in its chain, so `podman rmi` (never forced) stops there and the cache stays."""
    current: str | None = image_id
    for _ in range(100):  # a chain is one image per Dockerfile step
        if current is None:
            return
        try:
            info = inspect_image(current)
        except ImageError:
            return
        if info.get("RepoTags"):
            return
        if subprocess.run(["podman", "rmi", current], capture_output=True, check=False).returncode != 0:
            return  # in use: a child image or a container
        current = info.get("Parent") or None


def prune() -> None:
    """Remove every untagged image (old builds and the layer cache): the next build is cold."""
    for _ in range(100):  # each pass frees the leaves the previous one exposed
        if not _run(["podman", "image", "prune", "--force"]).strip():
            return


def build_all(names: Sequence[str] | None = None, force: bool = False) -> list[Built]:
    base = ensure_base()
    return [base, *(build(IMAGES[n], base, force) for n in (names or list(IMAGES)))]


# -- running ----------------------------------------------------------------------------------------

_WRAPPER = '''#!{python} -I
"""OCI runtime wrapper for these VMs: setting rlimits on a container's process is refused here (and,
under containerd, writing its oom_score_adj), so drop process.{keys} from the bundle's
config.json, then run runc with the same arguments. Written by ckpt_e2e.images."""
import json, os, sys

args = sys.argv[1:]
bundle = None
for i, arg in enumerate(args):
    if arg in ("--bundle", "-b") and i + 1 < len(args):
        bundle = args[i + 1]
    elif arg.startswith("--bundle="):
        bundle = arg.split("=", 1)[1]
if bundle is not None:
    path = os.path.join(bundle, "config.json")
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
        process = config.get("process", {{}})
        if [process.pop(key) for key in {drop!r} if key in process]:
            with open(path + ".tmp", "w") as f:
                json.dump(config, f)
            os.replace(path + ".tmp", path)
os.execv({runc!r}, [{runc!r}, *args])
'''


def runtime_wrapper(drop: tuple[str, ...] = ("rlimits",)) -> Path:
    """The runc wrapper that drops `drop` from the bundle's process, under the cache dir,
    (re)written when its content would differ. podman needs rlimits gone; containerd's CRI also
    sets oomScoreAdj (the real node, realnode.py)."""
    runc = require_tools()["runc"]
    path = images_dir() / "runtime" / ("runc-no-" + "-".join(k.lower() for k in drop))
    body = _WRAPPER.format(python=sys.executable, runc=str(runc), keys="/".join(drop), drop=drop)
    if not path.exists() or path.read_text() != body:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(body)
        tmp.chmod(0o755)
        tmp.replace(path)
    return path


def podman() -> list[str]:
    """podman with the flags these VMs need (cgroup v1+v2 hybrid, no rlimits)."""
    return ["podman", "--cgroup-manager", "cgroupfs", "--runtime", str(runtime_wrapper())]


@dataclass(frozen=True)
class Container:
    """How to run an image the way the chart does: read-only root, no capabilities, no privilege
    escalation, a non-root user, a tmpfs /tmp. `mounts` are (host file, path inside) pairs,
    mounted read-only."""

    image: str
    name: str
    user: str | None = None  # None: the image's USER
    network: str = "host"
    read_only: bool = True
    tmpfs: tuple[str, ...] = ("/tmp",)
    mounts: tuple[tuple[Path, Path], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: Sequence[str] | None = None

    def run_argv(self, args: Sequence[str] = ()) -> list[str]:
        argv = [*podman(), "run", "--rm", "--name", self.name, "--network", self.network]
        argv += ["--label", f"{OWNER_LABEL}={os.getpid()}"]
        argv += ["--cap-drop=all", "--security-opt", "no-new-privileges"]
        if self.read_only:
            argv.append("--read-only")
        if self.user is not None:
            argv += ["--user", self.user]
        for path in self.tmpfs:
            argv += ["--tmpfs", path]
        for host, inside in self.mounts:
            argv += ["-v", f"{host.resolve()}:{inside}:ro"]
        for key, value in sorted(self.env.items()):
            argv += ["-e", f"{key}={value}"]
        if self.entrypoint is not None:
            # --entrypoint takes a JSON array for a multi-word entrypoint.
            argv += ["--entrypoint", json.dumps(list(self.entrypoint))]
        return [*argv, self.image, *args]

    def run(self, args: Sequence[str] = (), timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run to completion (e.g. `--help`); the container is removed whatever happens."""
        try:
            return subprocess.run(
                self.run_argv(args), capture_output=True, text=True, timeout=timeout, check=False
            )
        finally:
            remove_container(self.name)

    def kill(self) -> None:
        """SIGKILL the container's process, as a node failure would."""
        subprocess.run([*podman(), "kill", "--signal", "KILL", self.name], capture_output=True, check=False)

    def remove(self) -> None:
        remove_container(self.name)


def containers(image: str | None = None) -> list[dict[str, Any]]:
    """`podman inspect` of the live containers this harness started (of `image`, if given)."""
    out = _run([*podman(), "ps", "--filter", f"label={OWNER_LABEL}={os.getpid()}", "--format", "{{.Names}}"])
    names = out.split()
    if not names:
        return []
    found: list[dict[str, Any]] = json.loads(_run([*podman(), "container", "inspect", *names]))
    return [c for c in found if image is None or c.get("ImageName") == image]


def remove_container(name: str) -> None:
    """`podman rm -f`: a container outlives the podman client that was killed (conmon keeps it)."""
    subprocess.run([*podman(), "rm", "--force", "--time", "5", name], capture_output=True, check=False)


def remove_stale_containers() -> list[str]:
    """Remove containers this harness started from processes that no longer exist (a SIGKILLed
    pytest cannot run its teardown); returns their names."""
    out = _run([*podman(), "ps", "--all", "--filter", f"label={OWNER_LABEL}", "--format", "json"])
    stale: list[str] = []
    for row in json.loads(out or "[]"):
        owner = (row.get("Labels") or {}).get(OWNER_LABEL, "")
        if owner.isdigit() and not pid_alive(int(owner)):
            stale.extend(row.get("Names") or [])
    for name in stale:
        remove_container(name)
    return stale


# -- CLI --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_e2e.images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build (or find cached) images; prints each image's size")
    p.add_argument("names", nargs="*", metavar="IMAGE", help=", ".join(IMAGES))
    p.add_argument("--all", action="store_true", help="every image (the default when none is named)")
    p.add_argument("--force", action="store_true", help="rebuild from scratch (no layer cache)")
    sub.add_parser("prune", help="remove untagged images: old builds and the layer cache")
    args = parser.parse_args(argv)
    if args.command == "prune":
        prune()
        return 0
    if unknown := sorted(set(args.names) - set(IMAGES)):
        parser.error(f"unknown image {', '.join(unknown)} (known: {', '.join(IMAGES)})")
    started = time.monotonic()
    try:
        for built in build_all(None if args.all else args.names or None, args.force):
            print(f"images: {built.summary()}", flush=True)
    except ImageError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    print(f"images: done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
