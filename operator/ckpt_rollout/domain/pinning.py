"""Which manifest digest an update call pins, and what the operator learns of versions' digests
(status.manifestDigests). A rollback returns to weights that served already; pinned to the digest
they were loaded with, it cannot be served another manifest published under the same version
name. Pure; table-tested."""

import re
from collections.abc import Iterable, Mapping

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def pin_for(version: str, *, spec_version: str, spec_pin: str | None, known: Mapping[str, str]) -> str | None:
    """The spec version is pinned as the spec says (a digest the agents reported for it is not
    promoted to a pin: the user chose not to pin it); any other version, a rollback's, to the
    digest recorded for it, if any."""
    if version == spec_version:
        return spec_pin
    return known.get(version)


def learned_digests(
    known: Mapping[str, str],
    *,
    version: str,
    reported: Iterable[str | None],
    spec_version: str,
    spec_pin: str | None,
    keep: Iterable[str | None],
) -> dict[str, str]:
    """`known` with `version`'s digest from this step's Updated reports, trimmed to the versions
    in `keep` (those a rollback may return to, and the target). A pinned spec version's digest is
    its pin. Reports that disagree (the source republished the version mid-rollout) change
    nothing; malformed ones are ignored, as is a version with no report yet."""
    kept = {v for v in keep if v}
    digests = {v: d for v, d in known.items() if v in kept}
    if version == spec_version and spec_pin is not None:
        heard = {spec_pin}
    else:
        heard = {r for r in reported if r is not None and _DIGEST.fullmatch(r)}
    if len(heard) == 1 and version in kept:
        digests[version] = heard.pop()
    return digests


def unpinned_note(version: str, known: Mapping[str, str]) -> str:
    """What a rollback message adds when it cannot be pinned ("" when it is): its version was
    loaded before the operator recorded digests, or no agent reported one."""
    if version in known:
        return ""
    return f", unpinned: no manifest digest of {version} is recorded"
