"""The generated CRD on a real apiserver: invalid specs rejected at create, defaults filled in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from ckpt_api.agent_api import UpdateWeightsRequest
from ckpt_api.constants import VERSION_PATTERN
from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.versions import validate_version
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


# Near-misses of the version pattern: its own alphabet plus what it must refuse (a trailing
# newline, '/', '..', spaces, non-ASCII letters and digits), and lengths around the 128 limit.
_VERSIONS = st.one_of(
    st.from_regex(VERSION_PATTERN, fullmatch=True),
    st.text(alphabet="aZ09._-/\n \t\u00b2\u00e9", max_size=12),
    st.from_regex(r"\A[a-z]{126,130}\Z"),
    st.from_regex(VERSION_PATTERN, fullmatch=True).map(lambda v: v + "\n"),
)


def _accepts(check: Any) -> bool:
    try:
        check()
    except (ValidationError, ValueError):
        return False
    return True


@pytest.mark.usefixtures("crd")
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=_VERSIONS)
@example(version="v2\n")
@example(version="a..b")
@example(version="x" * 128)
@example(version="x" * 129)
def test_the_apiserver_the_models_and_the_agent_agree_on_every_version(
    k8s_api: client.ApiClient, namespace: str, version: str
) -> None:
    """One rule for a version name, wherever it is checked: the CRD's schema (the apiserver's
    Go regexp and CEL), the spec model (pydantic's regex), the agent's request model and the
    shared validate_version (Python's re, whose `$` also matches before a final newline)."""
    api = client.CustomObjectsApi(k8s_api)
    spec = {**valid_spec(), "version": version}

    def create() -> None:
        try:
            api.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _rollout("probe", spec), dry_run="All"
            )
        except ApiException as exc:
            if exc.status != 422:
                raise
            raise ValueError(exc.body) from None

    verdicts = {
        "apiserver": _accepts(create),
        "spec model": _accepts(lambda: CheckpointRolloutSpec.model_validate(spec)),
        "agent request": _accepts(lambda: UpdateWeightsRequest.model_validate({"version": version})),
        "validate_version": _accepts(lambda: validate_version(version)),
    }
    assert len(set(verdicts.values())) == 1, f"{version!r}: {verdicts}"
