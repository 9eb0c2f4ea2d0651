"""Wording the operator's messages share with the user tools' views."""


def counted(n: int, noun: str) -> str:
    """``n`` and a regular noun, singular for exactly one: "1 pod", "0 pods", "2 pods"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
