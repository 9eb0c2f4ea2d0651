"""The generated CRD on a real apiserver: invalid specs rejected at create, defaults filled in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.testdata import INVALID_SPECS, InvalidSpec, valid_spec, valid_spec_defaults

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml"
GROUP, VERSION, PLURAL = "rollout.ckpt.dev", "v1alpha1", "checkpointrollouts"


@pytest.fixture(scope="module")
def crd(cluster: ClusterHandle) -> None:
    cluster.kubectl.apply(CRD_FILE)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=30s")


def _rollout(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CheckpointRollout",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda c: c.id)
def test_invalid_spec_is_rejected_at_create(
    k8s_api: client.ApiClient, namespace: str, case: InvalidSpec
) -> None:
    api = client.CustomObjectsApi(k8s_api)
    with pytest.raises(ApiException) as rejected:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _rollout("bad", case.spec))
    body = rejected.value.body or ""
    assert rejected.value.status == 422, f"{case.id}: expected 422 Invalid, got {body}"
    # The rejection must point at the offending field, so users can fix their manifest.
    assert f"spec.{case.field}" in body, (
        f"{case.id} ({case.reason}): error names no spec.{case.field}: {body}"
    )


@pytest.mark.usefixtures("crd")
def test_valid_spec_is_accepted_with_defaults(k8s_api: client.ApiClient, namespace: str) -> None:
    api = client.CustomObjectsApi(k8s_api)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _rollout("ok", valid_spec()))
    stored = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ok")["spec"]
    for key, value in valid_spec().items():
        assert stored[key] == value, key
    for key, default in valid_spec_defaults().items():
        assert stored.get(key) == default, f"default for spec.{key}"
