"""Find or build the pinned control-plane binaries.

Resolution order for each binary (first hit wins):
  1. an explicit path: ``CKPT_E2E_<NAME>`` (e.g. ``CKPT_E2E_KUBE_APISERVER``), or a file of that
     name in ``KUBEBUILDER_ASSETS`` (envtest's layout);
  2. the cache ``<cache>/bin/<version>/<name>`` (``<cache>`` = ``$CKPT_E2E_CACHE_DIR`` or
     ``$XDG_CACHE_HOME/ckpt-rollout`` or ``~/.cache/ckpt-rollout``);
  3. a build from Go modules through the module proxy (needs ``go``);
  4. a download of the official release binary, only when ``CKPT_E2E_ALLOW_DOWNLOAD=1``
     (the CI machine has no internet; this path is for users who do).

This module is stdlib-only so ``e2e/provision.sh`` can run it before any venv exists:
``python3 e2e/ckpt_e2e/provision.py [--jobs N] [NAME ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script before the package is installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ckpt_e2e.versions import BINARIES, COMPONENTS, Component, prometheus_release
else:
    from .versions import BINARIES, COMPONENTS, Component, prometheus_release


class ProvisionError(RuntimeError):
    """A binary could not be provided; the message says which, at which step, and how to retry."""


def cache_root() -> Path:
    if env := os.environ.get("CKPT_E2E_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ckpt-rollout"


def cached_path(name: str) -> Path:
    return cache_root() / "bin" / BINARIES[name].version / name


def env_var_for(name: str) -> str:
    return "CKPT_E2E_" + name.upper().replace("-", "_")


def explicit_path(name: str) -> Path | None:
    """A user-supplied binary; a set-but-wrong path is an error, not a silent fallback."""
    if value := os.environ.get(env_var_for(name)):
        path = Path(value)
        if not _is_executable(path):
            raise ProvisionError(
                f"{name}: {env_var_for(name)}={value} is not an executable file "
                f"(step: explicit path). Fix or unset it."
            )
        return path
    if assets := os.environ.get("KUBEBUILDER_ASSETS"):
        candidate = Path(assets) / name
        if _is_executable(candidate):
            return candidate
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def retry_hint(names: list[str]) -> str:
    return f"python3 e2e/ckpt_e2e/provision.py {' '.join(names)}"


# --------------------------------------------------------------------------- build from Go


def _wrapper_gomod(component: Component) -> str:
    """go.mod of a throwaway main module that depends on the published module.

    k8s.io/kubernetes requires its staging modules (k8s.io/api, client-go, ...) at v0.0.0 and
    replaces them with ./staging paths; replace directives of a dependency are ignored, so the
    wrapper re-points each one at its published v0.Y.Z tag. The list is read from the
    published go.mod so new staging modules (1.36 added two) need no code change.
    """
    lines = ["module ckpt-rollout.local/build/" + component.name, "", "go 1.26", ""]
    lines.append(f"require {component.module} {component.version}")
    if component.module == "k8s.io/kubernetes":
        staging_version = "v0" + component.version[2:]  # v1.37.2 -> v0.37.2
        lines.append("")
        lines.append("replace (")
        for mod in _staging_modules(component):
            lines.append(f"\t{mod} => {mod} {staging_version}")
        lines.append(")")
    return "\n".join(lines) + "\n"


def _staging_modules(component: Component) -> list[str]:
    out = _run_go(
        ["go", "mod", "download", "-json", f"{component.module}@{component.version}"],
        cwd=Path(tempfile.gettempdir()),
        log=None,
    )
    gomod_path = _json_field(out, "GoMod")
    mods = []
    for raw in Path(gomod_path).read_text().splitlines():
        parts = raw.split()
        # "k8s.io/api => ./staging/src/k8s.io/api" (inside a replace block)
        if len(parts) == 3 and parts[1] == "=>" and parts[2].startswith("./staging/"):
            mods.append(parts[0])
    if not mods:
        raise ProvisionError(f"{component.name}: no staging replaces found in {gomod_path}")
    return mods


def _json_field(text: str, field: str) -> str:
    import json

    return str(json.loads(text)[field])


def _go_env(jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",
        GOFLAGS="-mod=mod -buildvcs=false",
        # Never let a module's toolchain line trigger a download the user did not ask for;
        # callers may still set GOTOOLCHAIN explicitly.
        GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "local"),
        GOMAXPROCS=str(jobs),
    )
    return env


def _run_go(cmd: list[str], cwd: Path, log: io.TextIOWrapper | None, jobs: int = 1) -> str:
    """Run a go command; with a log, stream its output there so a long build can be followed."""
    if log is None:
        captured = subprocess.run(cmd, cwd=cwd, env=_go_env(jobs), capture_output=True, text=True)
        output, code, stdout = captured.stdout + captured.stderr, captured.returncode, captured.stdout
    else:
        log.write(f"$ (cd {cwd} && {' '.join(cmd)})\n")
        log.flush()
        start = log.tell()
        code = subprocess.run(
            cmd, cwd=cwd, env=_go_env(jobs), stdout=log, stderr=subprocess.STDOUT
        ).returncode
        log.flush()
        with open(log.name) as reread:
            reread.seek(start)
            output = stdout = reread.read()
    if code != 0:
        tail = "\n".join(output.strip().splitlines()[-20:])
        raise ProvisionError(f"`{' '.join(cmd)}` failed (exit {code}):\n{tail}")
    return stdout


def _go_binary_name(pkg: str) -> str:
    """The file `go build -o dir/` writes: the last path element, skipping a /vN suffix."""
    parts = pkg.split("/")
    if len(parts) > 1 and re.fullmatch(r"v[2-9][0-9]*", parts[-1]):
        return parts[-2]
    return parts[-1]


def _build_lock(component: Component) -> contextlib.AbstractContextManager[None]:
    """Serialize builds of one component across processes (make, CI and pytest may race)."""
    return file_lock(cache_root() / "build" / f"{component.name}-{component.version}.lock")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path``, held for the block, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(component: Component, jobs: int, names: list[str] | None = None) -> None:
    """Build binaries of `component` (all, or `names`) into the cache (atomic rename, so re-runs
    are safe). Only what is asked for is linked: adding a binary to a component must not relink
    the ones already cached (each k8s link is a minute on 2 cores)."""
    names = list(names or component.packages)
    work = cache_root() / "build" / f"{component.name}-{component.version}"
    work.mkdir(parents=True, exist_ok=True)
    log_path = cache_root() / "build" / f"{component.name}-{component.version}.log"
    dest = cache_root() / "bin" / component.version
    dest.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"\n=== build {component.name} {component.version} at {time.ctime()}\n")
        try:
            if shutil.which("go") is None:
                raise ProvisionError("`go` not found on PATH (Go >= 1.26 is needed)")
            if component.source is not None:
                for path in component.source.iterdir():
                    if path.name == "go.mod" or path.suffix == ".go":
                        shutil.copyfile(path, work / path.name)
            else:
                (work / "go.mod").write_text(_wrapper_gomod(component))
            (work / "go.sum").touch()
            pkgs = [component.packages[n] for n in names]
            # -mod=mod (in _go_env) lets `go build` fill go.sum for exactly what it compiles.
            staging = Path(tempfile.mkdtemp(prefix=".build-", dir=dest))
            try:
                _run_go(
                    [
                        "go",
                        "build",
                        "-p",
                        str(jobs),
                        "-trimpath",
                        # The linker drops DWARF anyway (-w); not generating it in the compiler
                        # saves ~11% of a cold build's CPU (kwok: 199 -> 176 CPU-s).
                        "-gcflags=all=-dwarf=false",
                        *(("-tags", ",".join(component.tags)) if component.tags else ()),
                        "-ldflags",
                        " ".join(("-s", "-w", *component.ldflags)),
                        "-o",
                        str(staging) + "/",
                        *pkgs,
                    ],
                    work,
                    log,
                    jobs,
                )
                for name in names:
                    built = staging / _go_binary_name(component.packages[name])
                    if not built.exists():
                        raise ProvisionError(f"{name}: go build produced no {built.name}")
                    os.replace(built, dest / name)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        except ProvisionError as exc:
            raise ProvisionError(
                f"{component.name} {component.version}: build from Go modules failed "
                f"(binaries: {', '.join(names)}; log: {log_path}).\n{exc}\n"
                f"Retry: {retry_hint(names)}"
            ) from None
        log.write(f"=== done ({', '.join(names)}) in {time.monotonic() - started:.0f}s\n")


# --------------------------------------------------------------------------- download

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine, "amd64")


def _release_urls(component: Component, name: str) -> tuple[str, str | None, str | None]:
    """(url, member inside a tarball or None, sha256 url or None) of an official release."""
    v, arch = component.version, _ARCH
    if component.name == "kubernetes":
        url = f"https://dl.k8s.io/release/{v}/bin/linux/{arch}/{name}"
        return url, None, url + ".sha256"
    if component.name == "etcd":
        base = f"https://github.com/etcd-io/etcd/releases/download/{v}"
        return f"{base}/etcd-{v}-linux-{arch}.tar.gz", f"etcd-{v}-linux-{arch}/etcd", None
    if component.name == "kwok":
        return (
            f"https://github.com/kubernetes-sigs/kwok/releases/download/{v}/kwok-linux-{arch}",
            None,
            None,
        )
    if component.name == "prometheus":
        stem = f"prometheus-{prometheus_release(v)}.linux-{arch}"
        base = f"https://github.com/prometheus/prometheus/releases/download/v{prometheus_release(v)}"
        return f"{base}/{stem}.tar.gz", f"{stem}/{name}", None
    if component.name == "helm":
        url = f"https://get.helm.sh/helm-{v}-linux-{arch}.tar.gz"
        return url, f"linux-{arch}/helm", url + ".sha256sum"
    raise ProvisionError(f"{name}: no release download known for component {component.name}")


def download(name: str) -> Path:
    component = BINARIES[name]
    url, member, sha_url = _release_urls(component, name)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            data: bytes = resp.read()
        if sha_url:
            with urllib.request.urlopen(sha_url, timeout=60) as resp:
                want = resp.read().decode().split()[0]
            if hashlib.sha256(data).hexdigest() != want:
                raise ProvisionError(f"sha256 mismatch for {url}")
        if member:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                extracted = tar.extractfile(member)
                if extracted is None:
                    raise ProvisionError(f"{member} missing in {url}")
                data = extracted.read()
    except (OSError, ProvisionError) as exc:
        raise ProvisionError(
            f"{name}: download of {url} failed (step: download): {exc}. "
            f"Retry: CKPT_E2E_ALLOW_DOWNLOAD=1 {retry_hint([name])}"
        ) from None
    dest = cached_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, dest)
    return dest


# --------------------------------------------------------------------------- resolution


def module_source(component_name: str) -> Path:
    """The unpacked source of a component's published module (its manifests: a CRD, webhooks),
    from the Go module cache, downloaded by the module proxy if the build has not already."""
    (component,) = [c for c in COMPONENTS if c.name == component_name]
    with tempfile.TemporaryDirectory() as tmp:
        out = _run_go(
            ["go", "mod", "download", "-json", f"{component.module}@{component.version}"], Path(tmp), None
        )
    return Path(_json_field(out, "Dir"))


def default_jobs() -> int:
    # Others share this machine: default to 2 parallel compiles at most.
    return int(os.environ.get("CKPT_E2E_BUILD_JOBS", min(2, os.cpu_count() or 1)))


def resolve(names: list[str] | None = None, *, jobs: int | None = None) -> dict[str, Path]:
    """Return a path for every requested binary, building or downloading missing ones."""
    names = list(names or BINARIES)
    unknown = [n for n in names if n not in BINARIES]
    if unknown:
        raise ProvisionError(f"unknown binaries {unknown}; known: {sorted(BINARIES)}")
    found: dict[str, Path] = {}
    for name in names:
        path = explicit_path(name)
        if path is None and _is_executable(cached_path(name)):
            path = cached_path(name)
        if path is not None:
            found[name] = path
    missing = [n for n in names if n not in found]
    for component in COMPONENTS:
        wanted = [n for n in missing if BINARIES[n] is component]
        if not wanted:
            continue
        try:
            with _build_lock(component):
                # Another process may have finished this build while we waited for the lock.
                still = [n for n in wanted if not _is_executable(cached_path(n))]
                if still:
                    build(component, jobs or default_jobs(), still)
        except ProvisionError as build_error:
            if os.environ.get("CKPT_E2E_ALLOW_DOWNLOAD") != "1":
                raise ProvisionError(
                    f"{build_error}\n(Download of release binaries is disabled; "
                    f"set CKPT_E2E_ALLOW_DOWNLOAD=1 to allow it.)"
                ) from None
            for name in wanted:
                download(name)
        for name in wanted:
            found[name] = cached_path(name)
    return {n: found[n] for n in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"binaries (default: all of {sorted(BINARIES)})")
    parser.add_argument("--jobs", type=int, default=None, help="parallel Go compiles")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        paths = resolve(args.names, jobs=args.jobs)
    except ProvisionError as exc:
        print(f"provision: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    print(f"provision: ready in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
