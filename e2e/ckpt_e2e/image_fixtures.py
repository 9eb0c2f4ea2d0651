"""pytest fixtures for the container images: built from their Dockerfiles (or found cached) once
per session, each image's size shown in the terminal summary. Load from a conftest with
``from ckpt_e2e.image_fixtures import *``.

Missing tools fail the tests that need them, with what to install: these tests are how we know
the images users deploy work, so they never skip."""

from __future__ import annotations

import pytest

from . import images
from .images import Built, ImageError

__all__ = ["built_images", "pytest_terminal_summary"]

_SUMMARY = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def built_images(request: pytest.FixtureRequest) -> dict[str, Built]:
    """Every image of `images.IMAGES` (plus "base"), by name."""
    problem = None
    try:
        images.require_tools()
        images.remove_stale_containers()
        built = {b.name: b for b in images.build_all()}
    except ImageError as exc:
        problem = str(exc)
    if problem is not None:  # outside the except: the report shows the reason, not a traceback chain
        pytest.fail(f"container images: {problem}", pytrace=False)
    lines = [b.summary() for b in built.values()]
    request.config.stash[_SUMMARY] = lines
    for line in lines:
        print(f"images: {line}")
    return built


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_SUMMARY, None)
    if lines:
        terminalreporter.section("container images")
        for line in lines:
            terminalreporter.write_line(line)
