"""`helm lint` and `helm template`: the rendered objects, per values switch."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from chart_render import CHART, ROOT, Helm, Obj, Rendered, rule_set

from ckpt_api.crd import build_crd
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import LEASE_NAME, WEIGHTS_READY_CONDITION

# What the operator calls, exactly (lead's contract in the chart's issue).
OPERATOR_RULES = {
    ("rollout.ckpt.dev", "checkpointrollouts", "get"),
    ("rollout.ckpt.dev", "checkpointrollouts", "list"),
    ("rollout.ckpt.dev", "checkpointrollouts", "watch"),
    ("rollout.ckpt.dev", "checkpointrollouts", "patch"),
    ("rollout.ckpt.dev", "checkpointrollouts/status", "get"),
    ("rollout.ckpt.dev", "checkpointrollouts/status", "patch"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "configmaps", "get"),
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("", "events", "list"),  # a worker pod's Warning events (FailedMount) when it cannot start
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    # What the agents ask SubjectAccessReview before obeying the operator.
    ("rollout.ckpt.dev", "agents", "get"),
    ("rollout.ckpt.dev", "agents", "update"),
}
AGENT_TOKEN_RULES = {("", "serviceaccounts/token", "create")}
LEASE_RULES = {
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
}
WORKER_RULES = {
    ("rollout.ckpt.dev", "checkpointrollouts", "get"),
    ("rollout.ckpt.dev", "checkpointrollouts/status", "get"),
    ("rollout.ckpt.dev", "checkpointrollouts/status", "patch"),
    ("", "pods", "get"),
    ("", "pods/status", "patch"),
    ("rollout.ckpt.dev", "agents/relay", "get"),  # peers read each other's relay
}
TOKENREVIEW_RULES = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
}

EVERYTHING_ON: Obj = {
    "watchNamespaces": ["team-a", "team-b"],
    "leaderElection": {"enabled": True, "leaseNamespace": "leases"},
    "replicaCount": 2,
    "metrics": {
        "service": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "podMonitor": {"enabled": True},
    },
    "workerRbac": {"enabled": True, "namespaces": ["rl-a", "rl-b"]},
    "imagePullSecrets": [{"name": "regcred"}],
    "podAnnotations": {"a": "b"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {}},
    "priorityClassName": "system-cluster-critical",
    "extraArgs": ["--agent-timeout=20"],
}


def _operator(rendered: Rendered) -> Obj:
    deployment = rendered.one("Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: Obj = containers[0]
    return container


def _pod_spec(rendered: Rendered) -> Obj:
    spec: Obj = rendered.one("Deployment")["spec"]["template"]["spec"]
    return spec


def _all_rules(rendered: Rendered) -> list[Obj]:
    return [r for o in rendered.objects if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]


# --------------------------------------------------------------------------- lint


def test_helm_lint_strict_with_defaults(helm: Helm) -> None:
    result = helm.run("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


def test_helm_lint_strict_with_every_switch_on(helm: Helm, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(EVERYTHING_ON))
    result = helm.run("lint", "--strict", str(CHART), "--values", str(values))
    assert "0 chart(s) failed" in result.stdout


# --------------------------------------------------------------------------- defaults


def test_default_objects(helm: Helm) -> None:
    rendered = helm.template()
    assert rendered.kinds() == [
        ("ClusterRole", "rel-ckpt-rollout"),
        ("ClusterRoleBinding", "rel-ckpt-rollout"),
        ("CustomResourceDefinition", "checkpointrollouts.rollout.ckpt.dev"),
        ("Deployment", "rel-ckpt-rollout"),
        ("Role", "rel-ckpt-rollout-agent-tokens"),
        ("RoleBinding", "rel-ckpt-rollout-agent-tokens"),
        # agentTLS: the agents' serving Secret (the release namespace is the worker one by
        # default) and the generated CA the operator trusts.
        ("Secret", "ckpt-rollout-agent-tls"),
        ("Secret", "rel-ckpt-rollout-agent-ca"),
        ("ServiceAccount", "rel-ckpt-rollout"),
    ]
    for obj in rendered.objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"):
            assert obj["metadata"]["namespace"] == "ops", obj["kind"]


def test_operator_pod_is_hardened(helm: Helm) -> None:
    rendered = helm.template()
    pod = _pod_spec(rendered)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = _operator(rendered)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    # The read-only root filesystem leaves /tmp writable through an emptyDir.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    tmp_volume = mounts["/tmp"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[tmp_volume]


def test_operator_probes_args_env_and_ports(helm: Helm) -> None:
    rendered = helm.template()
    container = _operator(rendered)
    assert container["image"] == "ckpt-rollout-operator:0.1.0"
    assert container["args"] == [
        "--all-namespaces",
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--agent-token-serviceaccount=ops/rel-ckpt-rollout",
        "--agent-token-seconds=3600",
        "--agent-audience=ckpt-rollout-agent",
        "--agent-ca-file=/var/run/secrets/ckpt-rollout/agent-ca/ca.crt",
        "--log-format=text",
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert rendered.one("Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def test_log_format_reaches_the_operator_and_a_typo_fails_the_install(helm: Helm) -> None:
    assert "--log-format=json" in _operator(helm.template({"logFormat": "json"}))["args"]
    error = helm.template_error({"logFormat": "yaml"})
    assert "logFormat" in error, error


def test_agent_tokens_are_minted_for_the_operators_own_account_only(helm: Helm) -> None:
    """Per-namespace tokens (the default): the operator may create tokens of its own
    ServiceAccount and of no other, and mounts no agent token."""
    rendered = helm.template({"agentAuth": {"tokenExpirationSeconds": 900}})
    role = rendered.one("Role", "rel-ckpt-rollout-agent-tokens", "ops")
    assert rule_set(role["rules"]) == AGENT_TOKEN_RULES
    assert [r["resourceNames"] for r in role["rules"]] == [["rel-ckpt-rollout"]]
    binding = rendered.one("RoleBinding", "rel-ckpt-rollout-agent-tokens", "ops")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-ckpt-rollout", "namespace": "ops"}]
    args = _operator(rendered)["args"]
    assert "--agent-token-seconds=900" in args
    assert not any(a.startswith("--agent-token-file") for a in args)
    assert "agent-token" not in [v["name"] for v in _pod_spec(rendered)["volumes"]]
    assert "agent-token" not in [m["name"] for m in _operator(rendered)["volumeMounts"]]
    other = helm.template({"serviceAccount": {"create": False, "name": "ops-sa"}})
    assert other.one("Role", "rel-ckpt-rollout-agent-tokens", "ops")["rules"][0]["resourceNames"] == [
        "ops-sa"
    ]
    assert "--agent-token-serviceaccount=ops/ops-sa" in _operator(other)["args"]


def test_legacy_agent_token_is_a_projected_token_for_the_agent_audience(helm: Helm) -> None:
    rendered = helm.template({"agentAuth": {"perNamespaceTokens": False}})
    assert all("agent-tokens" not in name for _, name in rendered.kinds())
    assert not any(a.startswith("--agent-token-serviceaccount") for a in _operator(rendered)["args"])
    assert "--agent-token-file=/var/run/secrets/ckpt-rollout/agent/token" in _operator(rendered)["args"]
    pod = _pod_spec(rendered)
    container = _operator(rendered)
    mount = next(
        m for m in container["volumeMounts"] if m["mountPath"] == "/var/run/secrets/ckpt-rollout/agent"
    )
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "audience": "ckpt-rollout-agent",
                "expirationSeconds": 3600,
                "path": "token",
            }
        }
    ]
    assert pod["serviceAccountName"] == rendered.one("ServiceAccount")["metadata"]["name"]


def test_cluster_rbac_lists_exactly_what_the_operator_calls(helm: Helm) -> None:
    rendered = helm.template()
    role = rendered.one("ClusterRole")
    assert rule_set(role["rules"]) == OPERATOR_RULES
    binding = rendered.one("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-ckpt-rollout", "namespace": "ops"}]


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_no_wildcards_anywhere(helm: Helm, values: Obj) -> None:
    rendered = helm.template(values)
    for rule in _all_rules(rendered):
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
        assert "nonResourceURLs" not in rule
    assert "escalate" not in str(_all_rules(rendered))


# --------------------------------------------------------------------------- switches


def test_watch_namespaces_gives_one_role_per_namespace_and_no_cluster_role(helm: Helm) -> None:
    rendered = helm.template({"watchNamespaces": ["team-a", "team-b"]})
    assert rendered.of_kind("ClusterRole") == []
    assert rendered.of_kind("ClusterRoleBinding") == []
    for ns in ("team-a", "team-b"):
        role = rendered.one("Role", namespace=ns)
        assert rule_set(role["rules"]) == OPERATOR_RULES
        binding = rendered.one("RoleBinding", namespace=ns)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-ckpt-rollout", "namespace": "ops"}
        ]
    args = _operator(rendered)["args"]
    assert "--namespace=team-a" in args
    assert "--namespace=team-b" in args
    assert "--all-namespaces" not in args


def test_leader_election_adds_a_lease_role_and_rolling_updates(helm: Helm) -> None:
    rendered = helm.template({"leaderElection": {"enabled": True}, "replicaCount": 2})
    lease_role = rendered.one("Role", "rel-ckpt-rollout-leader-election", "ops")
    assert rule_set(lease_role["rules"]) == LEASE_RULES
    # get/update only on the operator's own Lease (create cannot be limited by name).
    named = {(v, tuple(r.get("resourceNames", []))) for r in lease_role["rules"] for v in r["verbs"]}
    assert named == {("create", ()), ("get", (LEASE_NAME,)), ("update", (LEASE_NAME,))}
    lease_binding = rendered.one("RoleBinding", "rel-ckpt-rollout-leader-election", "ops")
    assert lease_binding["roleRef"]["name"] == lease_role["metadata"]["name"]
    assert rule_set(rendered.one("ClusterRole")["rules"]) == OPERATOR_RULES  # leases stay namespaced
    args = _operator(rendered)["args"]
    assert "--leader-election" in args
    assert "--lease-namespace=ops" in args
    deployment = rendered.one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"

    elsewhere = helm.template({"leaderElection": {"enabled": True, "leaseNamespace": "leases"}})
    assert rule_set(elsewhere.one("Role", namespace="leases")["rules"]) == LEASE_RULES
    assert "--lease-namespace=leases" in _operator(elsewhere)["args"]


def test_no_lease_permissions_without_leader_election(helm: Helm) -> None:
    rendered = helm.template()
    assert not any(group == "coordination.k8s.io" for group, _, _ in rule_set(_all_rules(rendered)))
    assert "--leader-election" not in _operator(rendered)["args"]


def test_several_replicas_need_leader_election(helm: Helm) -> None:
    error = helm.template_error({"replicaCount": 2})
    assert "leaderElection.enabled" in error


@pytest.mark.parametrize(
    ("crds", "present", "kept"),
    [
        ({}, True, True),
        ({"keep": False}, True, False),
        ({"install": False}, False, False),
    ],
)
def test_crd_switches(helm: Helm, crds: Obj, present: bool, kept: bool) -> None:
    rendered = helm.template({"crds": crds})
    found = rendered.of_kind("CustomResourceDefinition")
    assert len(found) == (1 if present else 0)
    if present:
        annotations = found[0]["metadata"].get("annotations", {})
        assert (annotations.get("helm.sh/resource-policy") == "keep") is kept
        assert found[0]["spec"] == build_crd()["spec"]


def test_rendered_crd_equals_the_kubectl_copy(helm: Helm) -> None:
    rendered = helm.template().one("CustomResourceDefinition")
    committed = yaml.safe_load((ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml").read_text())
    assert rendered["spec"] == committed["spec"]
    assert rendered["metadata"]["name"] == committed["metadata"]["name"]


def test_metrics_switches(helm: Helm) -> None:
    off = helm.template()
    for kind in ("Service", "ServiceMonitor", "PodMonitor"):
        assert off.of_kind(kind) == []
    on = helm.template(EVERYTHING_ON)
    service = on.one("Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = on.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = on.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    pod_monitor = on.one("PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"


def test_service_monitor_needs_the_service(helm: Helm) -> None:
    error = helm.template_error({"metrics": {"serviceMonitor": {"enabled": True}}})
    assert "metrics.service.enabled" in error


def test_worker_rbac_is_opt_in(helm: Helm) -> None:
    rendered = helm.template()
    assert not any("worker" in name or "reader" in name for _, name in rendered.kinds())
    assert [r["metadata"]["name"] for r in rendered.of_kind("Role")] == ["rel-ckpt-rollout-agent-tokens"]


def test_metrics_readers_may_get_agents_in_each_worker_namespace(helm: Helm) -> None:
    readers = [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"},
        {"kind": "ServiceAccount", "name": "scraper"},  # the worker namespace's own
        {"kind": "Group", "name": "sre"},
    ]
    rendered = helm.template(
        {
            "workerRbac": {"enabled": True, "namespaces": ["rl-a", "rl-b"]},
            "agentAuth": {"metricsReaders": readers},
        }
    )
    for ns in ("rl-a", "rl-b"):
        role = rendered.one("Role", "rel-ckpt-rollout-agent-reader", ns)
        assert rule_set(role["rules"]) == {("rollout.ckpt.dev", "agents", "get")}
        binding = rendered.one("RoleBinding", "rel-ckpt-rollout-agent-reader", ns)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"},
            {"kind": "ServiceAccount", "name": "scraper", "namespace": ns},
            {"kind": "Group", "name": "sre", "apiGroup": "rbac.authorization.k8s.io"},
        ]
    plain = helm.template({"workerRbac": {"enabled": True}})
    assert all("reader" not in name for _, name in plain.kinds())
    error = helm.template_error({"agentAuth": {"metricsReaders": [{"kind": "Robot", "name": "x"}]}})
    assert "metricsReaders" in error, error


def test_worker_rbac_grants_exactly_what_the_agent_needs(helm: Helm) -> None:
    rendered = helm.template({"workerRbac": {"enabled": True, "namespaces": ["rl-a", "rl-b"]}})
    for ns in ("rl-a", "rl-b"):
        account = rendered.one("ServiceAccount", "ckpt-rollout-worker", ns)
        role = rendered.one("Role", namespace=ns)
        assert rule_set(role["rules"]) == WORKER_RULES
        binding = rendered.one("RoleBinding", namespace=ns)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": ns}
        ]
    tokenreview = rendered.one("ClusterRole", "rel-ckpt-rollout-worker-tokenreview")
    assert rule_set(tokenreview["rules"]) == TOKENREVIEW_RULES
    binding = rendered.one("ClusterRoleBinding", "rel-ckpt-rollout-worker-tokenreview")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ckpt-rollout-worker", "namespace": ns} for ns in ("rl-a", "rl-b")
    ]


def test_source_policy_reaches_the_operator_and_a_malformed_rule_fails_the_install(helm: Helm) -> None:
    assert not any("sources" in a for a in _operator(helm.template())["args"])
    rules = ["https://ckpt.example.com/rl", "mooncake://10.0.0.0/8"]
    args = _operator(helm.template({"sourcePolicy": {"allowedSources": rules, "allowLinkLocal": True}}))[
        "args"
    ]
    assert "--allowed-sources=https://ckpt.example.com/rl,mooncake://10.0.0.0/8" in args
    assert "--allow-link-local-sources" in args
    assert "/sourcePolicy/allowedSources/0" in helm.template_error(
        {"sourcePolicy": {"allowedSources": ["a,b"]}}
    )


def test_worker_admission_policies_bind_the_worker_accounts_and_compare_every_other_status_field(
    helm: Helm,
) -> None:
    """On with worker RBAC: one policy (and its Deny binding) per status subresource, matching the
    worker accounts of every worker namespace; the rollout policy compares every status field but
    workers, so a field added to the status model and missing here fails this test."""
    rendered = helm.template({"workerRbac": {"enabled": True, "namespaces": ["rl-a", "rl-b"]}})
    policies = {p["metadata"]["name"]: p for p in rendered.of_kind("ValidatingAdmissionPolicy")}
    assert sorted(policies) == [
        "rel-ckpt-rollout-worker-checkpointrollouts-status",
        "rel-ckpt-rollout-worker-pods-status",
    ]
    for name, policy in policies.items():
        binding = rendered.one("ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == (
            "request.userInfo.username in ['system:serviceaccount:rl-a:ckpt-rollout-worker', "
            "'system:serviceaccount:rl-b:ckpt-rollout-worker']"
        )
        assert policy["spec"]["failurePolicy"] == "Fail"
    rules = policies["rel-ckpt-rollout-worker-checkpointrollouts-status"]["spec"]["validations"]
    compared = set(re.findall(r"object\.\?status\.\?(\w+) == oldObject", rules[-1]["expression"]))
    fields = {f.alias or n for n, f in CheckpointRolloutStatus.model_fields.items()}
    assert compared == fields - {"workers"}
    off = helm.template({"workerRbac": {"enabled": True, "admissionPolicy": False}})
    assert off.of_kind("ValidatingAdmissionPolicy") == []


def test_the_pod_status_policy_lets_a_worker_change_only_its_weights_ready_condition(helm: Helm) -> None:
    """Not its podIP (which the operator and peers dial with their credentials), phase or any
    other field, today's or a later Kubernetes's (the status is compared key by key, none
    listed), nor another condition, nor its labels. The apiserver's verdicts on these
    expressions: e2e/tests/test_worker_admission.py."""
    rendered = helm.template({"workerRbac": {"enabled": True}})
    spec = rendered.one("ValidatingAdmissionPolicy", "rel-ckpt-rollout-worker-pods-status")["spec"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert (variables["before"], variables["after"]) == ("dyn(oldObject.status)", "dyn(object.status)")
    rules = {v["expression"]: v.get("messageExpression", v.get("message")) for v in spec["validations"]}
    every_field = (
        "variables.after.all(k, k == 'conditions' || (k in variables.before && "
        "variables.before[k] == variables.after[k])) && variables.before.all(k, k == 'conditions' "
        "|| k in variables.after)"
    )
    assert "no other status field" in rules[every_field]
    others = f"filter(c, c.type != '{WEIGHTS_READY_CONDITION}')"
    conditions = (
        f"object.status.?conditions.orValue([]).{others} == oldObject.status.?conditions.orValue([]).{others}"
    )
    assert (
        f"may change only its {WEIGHTS_READY_CONDITION} condition, not its other conditions"
        in rules[conditions]
    )
    metadata = (
        "object.metadata.?labels == oldObject.metadata.?labels && "
        "object.metadata.?annotations == oldObject.metadata.?annotations"
    )
    assert metadata in rules


def test_worker_network_policy_lets_only_the_operator_and_peers_reach_the_agent(helm: Helm) -> None:
    assert helm.template({"workerRbac": {"enabled": True}}).of_kind("NetworkPolicy") == []
    scraper = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    mooncake = {"enabled": True, "minPort": 15100, "maxPort": 15199}
    policy_values = {"enabled": True, "mooncake": mooncake, "metricsFrom": scraper}
    rendered = helm.template(
        {"workerRbac": {"enabled": True, "namespaces": ["rl-a", "rl-b"], "networkPolicy": policy_values}}
    )
    policies = rendered.of_kind("NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["rl-a", "rl-b"]
    operator_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    workers = {"matchLabels": {"app": "rollout-worker"}}
    for policy in policies:
        spec = policy["spec"]
        assert (spec["podSelector"], spec["policyTypes"]) == (workers, ["Ingress"])
        agent, metrics, mooncake = spec["ingress"]
        assert agent["ports"] == [{"port": 8089, "protocol": "TCP"}]
        operator, peers = agent["from"]
        assert operator["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
        assert operator["podSelector"]["matchLabels"].items() <= operator_labels.items()
        assert peers == {"podSelector": workers}
        assert metrics == {"ports": [{"port": 8090, "protocol": "TCP"}], "from": scraper}
        assert mooncake["ports"] == [{"port": 15100, "endPort": 15199, "protocol": "TCP"}]
        assert mooncake["from"] == [{"podSelector": workers}]
    # Mooncake not enabled: no one reaches its ports (the policy lists only the agent and metrics).
    rendered = helm.template({"workerRbac": {"enabled": True, "networkPolicy": {"enabled": True}}})
    assert len(rendered.one("NetworkPolicy")["spec"]["ingress"]) == 2
    upside_down = {"enabled": True, "mooncake": {"enabled": True, "minPort": 17000, "maxPort": 15000}}
    error = helm.template_error({"workerRbac": {"enabled": True, "networkPolicy": upside_down}})
    assert "minPort is above maxPort" in error


def test_worker_rbac_defaults_to_the_release_namespace_and_an_existing_account(helm: Helm) -> None:
    rendered = helm.template(
        {"workerRbac": {"enabled": True, "serviceAccount": {"create": False, "name": "my-workers"}}}
    )
    assert [o["metadata"]["name"] for o in rendered.of_kind("ServiceAccount")] == ["rel-ckpt-rollout"]
    binding = rendered.one("RoleBinding", "rel-ckpt-rollout-worker-agent", "ops")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "my-workers", "namespace": "ops"}]


def test_pod_placement_and_extras_pass_through(helm: Helm) -> None:
    rendered = helm.template(EVERYTHING_ON)
    pod = _pod_spec(rendered)
    assert pod["nodeSelector"] == EVERYTHING_ON["nodeSelector"]
    assert pod["tolerations"] == EVERYTHING_ON["tolerations"]
    assert pod["affinity"] == EVERYTHING_ON["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert rendered.one("Deployment")["spec"]["template"]["metadata"]["annotations"] == {"a": "b"}
    assert _operator(rendered)["args"][-1] == "--agent-timeout=20"


def test_image_tag_and_digest(helm: Helm) -> None:
    tagged = helm.template({"image": {"repository": "reg.example/ckpt/operator", "tag": "dev"}})
    assert _operator(tagged)["image"] == "reg.example/ckpt/operator:dev"
    digest = "sha256:" + "a" * 64
    pinned = helm.template({"image": {"tag": "dev", "digest": digest}})
    assert _operator(pinned)["image"] == f"ckpt-rollout-operator@{digest}"


def test_existing_service_account(helm: Helm) -> None:
    rendered = helm.template({"serviceAccount": {"create": False, "name": "ops-sa"}})
    assert rendered.of_kind("ServiceAccount") == []
    assert _pod_spec(rendered)["serviceAccountName"] == "ops-sa"
    assert rendered.one("ClusterRoleBinding")["subjects"][0]["name"] == "ops-sa"
    assert "serviceAccount.name is required" in helm.template_error({"serviceAccount": {"create": False}})


def test_rbac_create_false_renders_no_operator_rbac(helm: Helm) -> None:
    rendered = helm.template({"rbac": {"create": False}})
    assert (
        rendered.of_kind("ClusterRole") == rendered.of_kind("Role") == rendered.of_kind("RoleBinding") == []
    )


def test_names_follow_overrides(helm: Helm) -> None:
    rendered = helm.template({"fullnameOverride": "ckr-op"})
    assert rendered.one("Deployment")["metadata"]["name"] == "ckr-op"
    same = helm.template(release="ckpt-rollout")
    assert same.one("Deployment")["metadata"]["name"] == "ckpt-rollout"
