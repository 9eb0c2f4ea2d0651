"""metav1.LabelSelector matching, done in-process against the pod index (no list calls)."""

from collections.abc import Mapping

from ckpt_api.spec import LabelSelector, SelectorOperator


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions or []:
        present = req.key in labels
        if req.operator is SelectorOperator.IN and (not present or labels[req.key] not in (req.values or [])):
            return False
        if req.operator is SelectorOperator.NOT_IN and present and labels[req.key] in (req.values or []):
            return False
        if req.operator is SelectorOperator.EXISTS and not present:
            return False
        if req.operator is SelectorOperator.DOES_NOT_EXIST and present:
            return False
    return True


def selectors_overlap(a: LabelSelector, b: LabelSelector) -> bool:
    """Conservative: two selectors overlap unless their matchLabels pin one key to different
    values. Expressions are not reasoned about, so they count as possibly overlapping."""
    la, lb = a.match_labels or {}, b.match_labels or {}
    return all(la[key] == lb[key] for key in la.keys() & lb.keys())
