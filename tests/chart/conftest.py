"""Chart tests render with the real helm binary; nothing here needs a cluster."""

from __future__ import annotations

import pytest
from chart_render import Helm, find_helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = find_helm()
    # `make test` provisions helm first; a missing binary is a set-up bug, never a skip.
    assert binary is not None, (
        "helm binary missing: `make provision` (python3 e2e/ckpt_e2e/provision.py helm)"
    )
    return Helm(binary)
