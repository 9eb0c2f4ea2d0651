"""values.schema.json as helm applies it: unknown keys and wrong types fail the render."""

from __future__ import annotations

import pytest
from chart_render import Helm, Obj
from pydantic import ValidationError

from ckpt_rollout.chartgen.chart_values import ChartValues

# (id, --set arguments or a values dict, fragment of helm's error)
BAD_VALUES: list[tuple[str, list[str] | Obj, str]] = [
    ("unknown-top-level-key", ["bogus=1"], "bogus"),
    ("unknown-nested-key", ["image.bogus=x"], "bogus"),
    ("typo-in-a-switch", ["crds.keepp=false"], "keepp"),
    ("unknown-key-in-worker-rbac", ["workerRbac.namespace=rl"], "namespace"),
    ("replicas-not-a-number", ["replicaCount=two"], "replicaCount"),
    ("negative-replicas", ["replicaCount=-1"], "replicaCount"),
    ("switch-not-a-bool", ["crds.install=maybe"], "install"),
    ("section-not-an-object", ["leaderElection=true"], "leaderElection"),
    ("port-out-of-range", ["healthPort=70000"], "healthPort"),
    ("namespace-not-a-dns-label", {"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    ("namespace-listed-twice", {"watchNamespaces": ["a", "a"]}, "watchNamespaces"),
    ("namespaces-not-a-list", ["watchNamespaces=team-a"], "watchNamespaces"),
    ("bad-quantity", ["resources.requests.memory=128MB"], "memory"),
    ("unknown-resources-key", ["resources.request.cpu=1"], "request"),
    ("bad-pull-policy", ["image.pullPolicy=Sometimes"], "pullPolicy"),
    ("bad-digest", ["image.digest=latest"], "digest"),
    ("token-too-short-lived", ["agentAuth.tokenExpirationSeconds=60"], "tokenExpirationSeconds"),
    ("bad-scrape-interval", ["metrics.podMonitor.interval=often"], "interval"),
    ("label-value-not-a-string", {"podLabels": {"team": {"nested": 1}}}, "team"),
]


def _split(spec: list[str] | Obj) -> tuple[Obj | None, list[str]]:
    return (None, spec) if isinstance(spec, list) else (spec, [])


@pytest.mark.parametrize(("case", "spec", "fragment"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_helm_rejects_bad_values(helm: Helm, case: str, spec: list[str] | Obj, fragment: str) -> None:
    values, sets = _split(spec)
    error = helm.template_error(values, *sets)
    assert "schema" in error.lower(), error
    assert fragment in error, error


@pytest.mark.parametrize(("case", "spec", "fragment"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_the_model_rejects_what_helm_rejects(case: str, spec: list[str] | Obj, fragment: str) -> None:
    # The same table through the pydantic model: the schema and the model agree.
    values, sets = _split(spec)
    if values is None:
        values = {}
        for item in sets:
            path, raw = item.split("=", 1)
            node = values
            *parents, leaf = path.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = _helm_scalar(raw)
    with pytest.raises(ValidationError):
        ChartValues.model_validate(values, strict=True)


def _helm_scalar(raw: str) -> object:
    """`--set` typing: ints, bools and null are parsed; everything else stays a string."""
    if raw in ("true", "false"):
        return raw == "true"
    try:
        return int(raw)
    except ValueError:
        return raw


def test_good_values_render(helm: Helm) -> None:
    helm.template(
        {
            "resources": {
                "requests": {"cpu": "0.5", "memory": "1Gi", "nvidia.com/gpu": 0},
                "limits": {"cpu": 2},
            },
            "watchNamespaces": ["team-a"],
            "image": {"digest": "sha256:" + "0" * 64},
            "metrics": {"podMonitor": {"interval": "1m30s"}},
        },
        "replicaCount=0",
    )
