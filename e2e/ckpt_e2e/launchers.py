"""How the harness runs a product command: as a child process of the checkout, or from its
container image the way the chart runs it. The operator and the agents are started through a
`Launcher`, so one harness serves both (tests pick per process, even per pod).

A launcher turns (arguments after the entrypoint, environment, files the command reads) into a
`Launch`: the argv to spawn plus, for a container, how to SIGKILL it and remove it (the podman
client is only a viewer: killing it leaves the container running under conmon).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from .images import Container, inspect_image
from .podruntime import Launch

_names = itertools.count()


class Launcher(Protocol):
    def launch(self, args: Sequence[str], name: str, env: Mapping[str, str], files: Sequence[Path]) -> Launch:
        """`name` identifies the workload in logs and container names; `files` are host paths the
        command reads (they appear at the same paths in a container)."""
        ...


@dataclass(frozen=True)
class ProcessLauncher:
    """`entrypoint` runs as a child process with the harness's environment plus `env`."""

    entrypoint: Sequence[str]

    def launch(self, args: Sequence[str], name: str, env: Mapping[str, str], files: Sequence[Path]) -> Launch:
        return Launch(argv=[*self.entrypoint, *args], env={**os.environ, **env})


@dataclass(frozen=True)
class ContainerLauncher:
    """The image's entrypoint (or `entrypoint`) under podman, hardened as the chart runs it:
    read-only root, no capabilities, no privilege escalation, tmpfs /tmp, the host network (pod
    IPs are loopback addresses here). Only `env` reaches the container, not the harness's.

    `files` appear at their host paths (so paths in flags stay valid) as copies owned by the
    container's user, mode 0400: what a Secret or projected volume with fsGroup gives a pod. The
    harness's own files stay private to it; a copy is a snapshot, not updated later."""

    image: str
    user: str | None = None  # "uid:gid"; None: the image's USER
    entrypoint: Sequence[str] | None = None

    def launch(self, args: Sequence[str], name: str, env: Mapping[str, str], files: Sequence[Path]) -> Launch:
        stage = Path(tempfile.mkdtemp(prefix="ckpt-e2e-mounts-"))
        uid, gid = self._ids()
        mounts = []
        for index, path in enumerate(dict.fromkeys(files)):
            copy = stage / f"{index}-{path.name}"
            shutil.copyfile(path, copy)
            os.chown(copy, uid, gid)
            copy.chmod(0o400)
            mounts.append((copy, path.absolute()))
        # Unique per harness process and start: a restarted workload never meets its old container.
        container = Container(
            image=self.image,
            name=f"ckpt-e2e-{name}-{os.getpid()}-{next(_names)}",
            user=self.user,
            mounts=tuple(mounts),
            env=dict(env),
            entrypoint=self.entrypoint,
        )

        def cleanup() -> None:
            container.remove()
            shutil.rmtree(stage, ignore_errors=True)

        return Launch(
            argv=container.run_argv(args), env=dict(os.environ), kill=container.kill, cleanup=cleanup
        )

    def _ids(self) -> tuple[int, int]:
        user = self.user or str(inspect_image(self.image)["Config"].get("User") or "0")
        uid, _, gid = user.partition(":")
        if not uid.isdigit() or not (gid or uid).isdigit():
            raise ValueError(f"{self.image}: user {user!r} is not numeric uid[:gid]")
        return int(uid), int(gid or uid)


def kubeconfig_files(kubeconfig: Path) -> list[Path]:
    """The kubeconfig and every file it points at (CA, client cert and key, token file), which a
    container needs mounted to use it."""
    found = [kubeconfig]
    config = yaml.safe_load(kubeconfig.read_text()) or {}
    entries = [c.get("cluster") or {} for c in config.get("clusters") or []]
    entries += [u.get("user") or {} for u in config.get("users") or []]
    for entry in entries:
        for key in ("certificate-authority", "client-certificate", "client-key", "tokenFile"):
            if value := entry.get(key):
                path = Path(value)
                # Relative paths are relative to the kubeconfig, as kubectl reads them.
                found.append(path if path.is_absolute() else kubeconfig.parent / path)
    return found
