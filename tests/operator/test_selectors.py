from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt_api.spec import LabelSelector
from ckpt_rollout.domain.selectors import selector_matches, selectors_overlap


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
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "a"}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "b"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"app": "w"}, False),
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


def _labels(**labels: str) -> dict[str, Any]:
    return {"matchLabels": labels}


def _with(selector: dict[str, Any], key: str, operator: str, *values: str) -> dict[str, Any]:
    expression = {"key": key, "operator": operator, **({"values": list(values)} if values else {})}
    return {**selector, "matchExpressions": [*selector.get("matchExpressions", []), expression]}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (_labels(app="w"), _labels(app="w"), True),
        (_labels(app="w"), _labels(app="w", pool="a"), True),
        (_labels(app="w", pool="a"), _labels(app="w", pool="b"), False),
        (_labels(app="w"), _labels(team="x"), True),
        # matchLabels still pin keys when expressions come along: still disjoint.
        (_labels(app="w", pool="a"), _with(_labels(app="w", pool="b"), "tier", "NotIn", "x"), False),
        (_with(_labels(pool="a"), "tier", "Exists"), _with(_labels(pool="b"), "tier", "Exists"), False),
        # A pod labelled tier=b matches both.
        (_labels(tier="b"), _with({}, "tier", "NotIn", "a"), True),
        # A pod without the key matches both NotIn and DoesNotExist.
        (_with({}, "tier", "NotIn", "a"), _with({}, "tier", "NotIn", "b"), True),
        (_with({}, "tier", "NotIn", "a"), _with(_labels(app="w"), "tier", "DoesNotExist"), True),
        (_with({}, "tier", "In", "a", "b"), _labels(tier="b"), True),
    ],
)
def test_selectors_overlap(a: dict[str, Any], b: dict[str, Any], expected: bool) -> None:
    sa, sb = LabelSelector.model_validate(a), LabelSelector.model_validate(b)
    assert selectors_overlap(sa, sb) is expected
    assert selectors_overlap(sb, sa) is expected


_keys = st.sampled_from(["app", "tier", "canary"])
_values = st.sampled_from(["a", "b", "c"])
_requirement = st.one_of(
    st.builds(
        lambda k, op, vs: {"key": k, "operator": op, "values": vs},
        _keys,
        st.sampled_from(["In", "NotIn"]),
        st.lists(_values, min_size=1, max_size=2, unique=True),
    ),
    st.builds(lambda k, op: {"key": k, "operator": op}, _keys, st.sampled_from(["Exists", "DoesNotExist"])),
)
_selectors = st.builds(
    lambda labels, exprs: {
        **({"matchLabels": labels} if labels else {}),
        **({"matchExpressions": exprs} if exprs else {}),
    },
    st.dictionaries(_keys, _values, max_size=2),
    st.lists(_requirement, max_size=2),
).filter(bool)
_label_sets = st.dictionaries(_keys, _values, max_size=3)


@given(_selectors, _selectors, st.lists(_label_sets, min_size=1, max_size=20))
def test_overlap_is_never_denied_when_some_pod_matches_both(
    a: dict[str, Any], b: dict[str, Any], pods: list[dict[str, str]]
) -> None:
    """The overlap check may be conservative (claim an overlap that no pod shows) but must never
    call two selectors disjoint when a pod matches both: that pod would be driven by two CRs."""
    sa, sb = LabelSelector.model_validate(a), LabelSelector.model_validate(b)
    if any(selector_matches(sa, p) and selector_matches(sb, p) for p in pods):
        assert selectors_overlap(sa, sb)
        assert selectors_overlap(sb, sa)
