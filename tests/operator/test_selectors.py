import pytest

from ckpt_api.spec import LabelSelector
from ckpt_rollout.selectors import selector_matches, selectors_overlap


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"app": "w"}}, {"app": "w", "x": "1"}, True),
        ({"matchLabels": {"app": "w"}}, {"app": "v"}, False),
        (
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
            {"tier": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"tier": ""}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {"tier": "x"}, False),
        (
            {
                "matchLabels": {"app": "w"},
                "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}],
            },
            {"app": "w"},
            True,
        ),
    ],
)
def test_selector_matches(selector: dict[str, object], labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(LabelSelector.model_validate(selector), labels) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ({"app": "w"}, {"app": "w"}, True),
        ({"app": "w"}, {"app": "w", "pool": "a"}, True),
        ({"app": "w", "pool": "a"}, {"app": "w", "pool": "b"}, False),
        ({"app": "w"}, {"team": "x"}, True),
    ],
)
def test_selectors_overlap(a: dict[str, str], b: dict[str, str], expected: bool) -> None:
    sa = LabelSelector.model_validate({"matchLabels": a})
    sb = LabelSelector.model_validate({"matchLabels": b})
    assert selectors_overlap(sa, sb) is expected
