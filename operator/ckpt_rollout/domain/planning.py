"""Wave planning: cumulative targets -> which pods go in which wave. Pure; table-tested.

Rounding rules (documented for users in README):
- A count wave targets ``min(count, N)`` pods; a percent wave targets ``ceil(p * N / 100)``
  pods, at least 1. N is the number of eligible pods (Running, with an IP) when the wave starts.
- Targets are cumulative and never shrink: a target below the previous wave's is raised to it,
  so such a wave adds nobody and is passed through at once.
- The last wave always covers every eligible pod, whatever its written target.
- Membership is deterministic: pods are ordered by sha256(rollout key + pod name), so the canary
  is stable across operator restarts yet not always the same pod for every rollout.
"""

import hashlib
import math
from collections.abc import Iterable, Sequence

from ckpt_api.versions import parse_percent


def wave_target(wave: int | str, replicas: int) -> int:
    if isinstance(wave, int):
        return min(wave, replicas)
    pct = parse_percent(wave)
    return min(replicas, max(1, math.ceil(pct * replicas / 100))) if replicas else 0


def cumulative_targets(waves: Sequence[int | str], replicas: int) -> list[int]:
    """The number of pods that should be updated after each wave."""
    targets: list[int] = []
    for index, wave in enumerate(waves):
        target = replicas if index == len(waves) - 1 else wave_target(wave, replicas)
        targets.append(max(target, targets[-1] if targets else 0))
    return targets


def rollout_order(pods: Iterable[str], key: str) -> list[str]:
    """Stable pseudo-random order of pods for one rollout."""
    return sorted(pods, key=lambda name: (hashlib.sha256(f"{key}/{name}".encode()).hexdigest(), name))


def plan_wave(
    *,
    index: int,
    waves: Sequence[int | str],
    eligible: Iterable[str],
    assigned: Iterable[str],
    key: str,
) -> list[str]:
    """Members of wave ``index`` given the pods already assigned to earlier waves.

    Pods assigned earlier that have since disappeared no longer count toward the target, so a
    vanished canary is replaced in the next wave rather than silently shrinking the rollout."""
    eligible_set = set(eligible)
    already = eligible_set & set(assigned)
    replicas = len(eligible_set)
    target = cumulative_targets(waves, replicas)[index]
    need = max(0, target - len(already))
    candidates = [p for p in rollout_order(eligible_set, key) if p not in already]
    return candidates[:need]


def failure_budget(max_failures: int | str, replicas: int) -> int:
    """How many failed workers a rollout tolerates. Percents round down: 10% of 5 pods is 0,
    which is the safe reading of a budget."""
    if isinstance(max_failures, int):
        return max_failures
    return math.floor(parse_percent(max_failures, allow_zero=True) * replicas / 100)
