"""Which namespace a user command acts in: `-n`, else the namespace of the context it uses (the
`--context` one, else the kubeconfig's current one), else `default` — as kubectl decides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ckpt_rollout.tools.actions import Target, connect


def _kubeconfig(path: Path) -> str:
    cluster = {"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}
    contexts = [
        {"name": "train", "context": {"cluster": "c", "user": "u", "namespace": "rl"}},
        {"name": "serve", "context": {"cluster": "c", "user": "u", "namespace": "inference"}},
        {"name": "bare", "context": {"cluster": "c", "user": "u"}},
    ]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": contexts,
        "current-context": "train",
    }
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize(
    ("context", "namespace", "expected"),
    [
        (None, None, "rl"),  # the current context's
        ("serve", None, "inference"),  # the named context's, not the current one's
        ("bare", None, "default"),  # a context without one
        ("serve", "other", "other"),  # -n wins
        (None, "other", "other"),
    ],
)
def test_the_namespace_follows_the_context_used(
    tmp_path: Path, context: str | None, namespace: str | None, expected: str
) -> None:
    kube, chosen = connect(Target(_kubeconfig(tmp_path / "config"), context, namespace))
    kube.close()
    assert chosen == expected
