"""`ckpt-rollout` mounts the product's command groups by module name, where import-linter cannot
follow: these tests hold the line the contracts hold for static imports. Every group is a product
package's and registers exactly the commands it declares (an absent group's hint names them), the
benches are not among them, and building the whole parser imports nothing of the harness."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from ckpt_cli.entry import build_parser
from ckpt_cli.groups import GROUPS, CommandGroup, absent_command, groups_for

# What the command line may mount: the operator's and the agent's packages, never the harness.
MOUNTABLE = {"ckpt_rollout", "ckpt_agent"}
ABSENT = CommandGroup("ckpt_nowhere.commands", "add_commands", ("frobnicate",), "pip install nowhere")


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_group_belongs_to_a_product_package() -> None:
    assert {g.package for g in GROUPS} == MOUNTABLE


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.module)
def test_a_group_registers_exactly_the_commands_it_declares(group: CommandGroup) -> None:
    assert _commands(build_parser([group])) == {"crd", *group.commands}


def test_benches_are_not_product_commands() -> None:
    commands = _commands(build_parser())
    assert "bench" not in commands
    assert {"crd", "operator", "status", "release", "publish", "serve", "agent"} <= commands


def test_an_absent_group_is_named_with_what_to_install() -> None:
    assert absent_command(["frobnicate", "--flag"], [*GROUPS, ABSENT]) == ABSENT
    assert absent_command(["status", "fleet"], [*GROUPS, ABSENT]) is None  # installed here
    epilog = build_parser([ABSENT]).epilog
    assert epilog == "not installed: frobnicate (needs pip install nowhere)"
    assert "frobnicate" not in _commands(build_parser([ABSENT]))


def _imported_packages(parse: str, packages: set[str]) -> list[str]:
    """Which of `packages` a fresh interpreter has imported after running `parse`."""
    code = (
        "import json, sys\n"
        "from ckpt_cli.entry import build_parser\n"
        "from ckpt_cli.groups import groups_for\n"
        f"{parse}\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {packages!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    imported: list[str] = json.loads(result.stdout)
    return imported


def test_the_whole_parser_imports_nothing_of_the_harness() -> None:
    assert _imported_packages("build_parser()", {"ckpt_e2e"}) == []


@pytest.mark.parametrize(
    ("argv", "mounted"),
    [
        (["agent", "--port", "0"], {"ckpt_agent.cli"}),
        (["status", "fleet"], {"ckpt_rollout.tools.commands"}),
        (["operator"], {"ckpt_rollout.controller.runner"}),
        (["--version"], {g.module for g in GROUPS}),
        (["crd"], {g.module for g in GROUPS}),
        (["frobnicate"], {g.module for g in GROUPS}),  # the full parser names the choices
        ([], {g.module for g in GROUPS}),
    ],
)
def test_a_command_mounts_only_the_group_that_owns_it(argv: list[str], mounted: set[str]) -> None:
    assert {g.module for g in groups_for(argv)} == mounted


def test_an_agent_start_imports_nothing_of_the_operator() -> None:
    parse = "build_parser(groups_for(['agent'])).parse_args(['agent', '--port', '0'])"
    assert _imported_packages(parse, {"ckpt_rollout", "kubernetes_asyncio"}) == []
