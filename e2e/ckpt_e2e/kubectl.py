"""A thin kubectl wrapper bound to one kubeconfig (and optionally a namespace)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class KubectlError(RuntimeError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"kubectl {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()}"
        )
        self.result = result
        self.stderr = result.stderr


@dataclass(frozen=True)
class Kubectl:
    binary: Path
    kubeconfig: Path
    namespace: str | None = None

    def in_namespace(self, namespace: str) -> Kubectl:
        return replace(self, namespace=namespace)

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}"]
        if self.namespace:
            argv.append(f"--namespace={self.namespace}")
        argv += list(args)
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(list(args), result)
        return result

    __call__ = run

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]] | str | Path) -> str:
        """Server-side apply of a dict, a list of dicts, YAML/JSON text, or a file."""
        if isinstance(manifest, Path):
            return self.run("apply", "--server-side", "-f", str(manifest)).stdout
        if isinstance(manifest, list):
            manifest = {"apiVersion": "v1", "kind": "List", "items": manifest}
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.run("apply", "--server-side", "-f", "-", input=text).stdout

    def create(self, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """`kubectl create`, unchecked: callers assert on acceptance or rejection."""
        return self.run("create", "-f", "-", "-o", "json", input=json.dumps(manifest), check=False)
