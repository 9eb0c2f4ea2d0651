"""examples/gitops/ownership-*.yaml: every CR is a valid stored spec, and the Argo CD sync the
e2e tier emulates (ckpt_e2e.gitops_sync) substitutes the ignored field only when the
Application respects its ignoreDifferences; the trainer's command in a header works as written."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_api.spec import DeclaredRolloutSpec
from ckpt_cli.entry import build_parser
from ckpt_e2e.gitops_sync import FLUX_IF_NOT_PRESENT, FLUX_SSA_ANNOTATION, argocd_target, ignored_pointers
from ckpt_rollout.tools.release import publish_dir

GITOPS = Path(__file__).resolve().parents[2] / "examples" / "gitops"
OWNERSHIP = sorted(GITOPS.glob("ownership-*.yaml"))


def _doc(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return dict(doc)


def test_there_is_an_example_per_operator_pattern() -> None:
    assert [p.name for p in OWNERSHIP] == [
        "ownership-argocd-ignore-version.yaml",
        "ownership-flux-if-not-present.yaml",
        "ownership-version-from.yaml",
    ]


@pytest.mark.parametrize("path", OWNERSHIP, ids=lambda p: p.stem)
def test_each_cr_is_a_valid_stored_spec(path: Path) -> None:
    DeclaredRolloutSpec.model_validate(_doc(path, "CheckpointRollout")["spec"])


def test_the_version_from_cr_leaves_the_version_to_the_configmap() -> None:
    spec = _doc(GITOPS / "ownership-version-from.yaml", "CheckpointRollout")["spec"]
    assert "version" not in spec
    assert set(spec["versionFrom"]["configMapKeyRef"]) == {"name", "key"}


def test_the_flux_cr_is_create_only() -> None:
    cr = _doc(GITOPS / "ownership-flux-if-not-present.yaml", "CheckpointRollout")
    assert cr["metadata"]["annotations"][FLUX_SSA_ANNOTATION] == FLUX_IF_NOT_PRESENT


ARGO = GITOPS / "ownership-argocd-ignore-version.yaml"


def _without_respect(app: dict[str, Any]) -> dict[str, Any]:
    plain = copy.deepcopy(app)
    options = plain["spec"]["syncPolicy"]["syncOptions"]
    plain["spec"]["syncPolicy"]["syncOptions"] = [o for o in options if not o.startswith("RespectIgnore")]
    return plain


@pytest.mark.parametrize(
    ("respect", "live_version", "applied"),
    [(True, "v9", "v9"), (False, "v9", "global_step_1200"), (True, None, "global_step_1200")],
    ids=["respected", "not-respected", "absent"],
)
def test_argocd_applies_the_live_value_only_when_it_respects_ignore_differences(
    respect: bool, live_version: str | None, applied: str
) -> None:
    app = _doc(ARGO, "Application")
    git = _doc(ARGO, "CheckpointRollout")
    assert ignored_pointers(app, git) == ["/spec/version"]
    live = None if live_version is None else {**git, "spec": {**git["spec"], "version": live_version}}
    target = argocd_target(app if respect else _without_respect(app), git, live)
    assert target["spec"]["version"] == applied
    assert {k: v for k, v in target["spec"].items() if k != "version"} == {
        k: v for k, v in git["spec"].items() if k != "version"
    }


def _commented_command(path: Path, program: str) -> list[str]:
    """The command a header comment shows (`# ` lines, `\\` continuations), as argv."""
    lines = [line.removeprefix("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith(program + " "))
    joined = lines[start]
    for line in lines[start + 1 :]:
        if not joined.endswith("\\"):
            break
        joined = joined.removesuffix("\\") + " " + line
    return shlex.split(joined)[1:]


def test_the_trainers_release_command_works_as_written() -> None:
    """The header's `ckpt-rollout release` parses and can publish behind the CR's source: a
    served (http) source needs --publish-root, which the command must name."""
    path = GITOPS / "ownership-version-from.yaml"
    args = build_parser().parse_args(_commented_command(path, "ckpt-rollout release"))
    cr = _doc(path, "CheckpointRollout")
    assert (args.rollout, args.namespace) == (cr["metadata"]["name"], cr["metadata"]["namespace"])
    assert args.source_dir is not None, "the trainer publishes its checkpoint with it"
    publish_dir(cr["spec"]["source"]["uri"], None if args.publish_root is None else Path(args.publish_root))
