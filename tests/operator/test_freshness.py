"""The daemon acts on the newest copy of its CR: kopf's live body or our last patch's answer."""

from typing import Any

import pytest

from ckpt_rollout.domain.freshness import freshest, resource_version


def obj(rv: str | None, tag: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "fleet"}
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "tag": tag}


@pytest.mark.parametrize(
    ("live_rv", "written_rv", "expected"),
    [
        ("10", "-", "live"),  # no write yet: the live body
        ("abc", "-", None),  # a live body that could never be ordered against a write: GET
        ("10", "12", "written"),  # our patch is not in the watch yet: acting on live would re-call
        ("12", "12", "live"),  # the watch delivered our patch
        ("15", "12", "live"),  # someone wrote after us (spec edit, agent push): it includes our write
        ("9", "10", "written"),  # etcd revisions compare as integers, not strings
        ("abc", "12", None),  # not an etcd revision: cannot order, GET
        ("10", "x", None),
        (None, None, None),
    ],
)
def test_freshest(live_rv: str | None, written_rv: str | None, expected: str | None) -> None:
    written = None if written_rv == "-" else obj(written_rv, "written")
    got = freshest(obj(live_rv, "live"), written)
    assert (got["tag"] if got is not None else None) == expected


def test_resource_version() -> None:
    assert resource_version(obj("42", "x")) == 42
    assert resource_version(obj(None, "x")) is None
    assert resource_version(None) is None
