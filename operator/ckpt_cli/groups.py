"""The command groups `ckpt-rollout` can mount, and which of them this installation has.

Each image installs only its own packages (the operator image: ckpt_api + ckpt_rollout; the
worker image: ckpt_api + ckpt_source + ckpt_agent), so a group is registered only when its
package is importable, and naming a command of an absent group says what to install instead of
a traceback. The groups are imported by name, where import-linter cannot see them: the tests of
this package check that every group belongs to a product package."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

OPERATOR_HINT = "pip install 'ckpt-rollout[operator]' (or run the operator image)"
AGENT_HINT = "pip install 'ckpt-rollout[agent]' (or run the worker image)"


@dataclass(frozen=True)
class CommandGroup:
    module: str  # defines `function(subparsers)`; imported only when its package is installed
    function: str
    commands: tuple[str, ...]  # what it registers: named here so an absent group can say so
    install_hint: str

    @property
    def package(self) -> str:
        return self.module.partition(".")[0]

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None


GROUPS: tuple[CommandGroup, ...] = (
    CommandGroup("ckpt_rollout.controller.runner", "add_command", ("operator",), OPERATOR_HINT),
    CommandGroup(
        "ckpt_rollout.tools.commands",
        "add_commands",
        ("status", "watch", "pause", "resume", "promote", "abort", "retry", "dashboard"),
        OPERATOR_HINT,
    ),
    CommandGroup("ckpt_rollout.tools.release_command", "add_command", ("release",), OPERATOR_HINT),
    CommandGroup("ckpt_rollout.tools.tls_command", "add_command", ("tls-secrets",), OPERATOR_HINT),
    CommandGroup("ckpt_agent.cli", "add_commands", ("publish", "serve", "agent"), AGENT_HINT),
)


def _command(argv: Sequence[str]) -> str | None:
    # The top level takes no option with a value, so its first word is the command.
    return next((a for a in argv if not a.startswith("-")), None)


def absent_command(argv: Sequence[str], groups: Sequence[CommandGroup] = GROUPS) -> CommandGroup | None:
    """The absent group that would have provided argv's command, if any."""
    command = _command(argv)
    return next((g for g in groups if command in g.commands and not g.installed()), None)


def groups_for(argv: Sequence[str], groups: Sequence[CommandGroup] = GROUPS) -> Sequence[CommandGroup]:
    """The groups a parser for argv must mount: the one that owns argv's command, or every group
    when argv names none of theirs (top-level help, `--version`, `crd`, a typo to report). An agent
    started as `ckpt-rollout agent` then never imports the operator's modules (kubernetes_asyncio
    and its models: ~0.4 s of CPU at every start of every worker and every CLI call)."""
    command = _command(argv)
    owner = [g for g in groups if command in g.commands]
    return owner or groups
