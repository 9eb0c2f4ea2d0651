"""Chart tests render with the real helm binary; nothing here needs a cluster."""

from __future__ import annotations

import pytest
from chart_render import Helm, find_helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = find_helm()
    if binary is None:
        pytest.skip(
            "helm binary missing: run `python3 e2e/ckpt_e2e/provision.py helm` "
            "(CI provisions it before the tests)"
        )
    return Helm(binary)
