"""The control-plane bench's pure parts: wave targets, apiserver request counting, the
overhead definition, and its registration on the CLI."""

from __future__ import annotations

from collections import Counter

import pytest

from ckpt_e2e.bench.cli import build_parser
from ckpt_e2e.bench.controlplane import (
    delta,
    overhead_per_wave,
    request_counts,
    summary_lines,
    wave_targets,
)

METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="rollout.ckpt.dev",\
resource="checkpointrollouts",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="rollout.ckpt.dev",\
resource="checkpointrollouts",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="rollout.ckpt.dev",\
resource="checkpointrollouts",scope="resource",subresource="",verb="GET",version="v1alpha1"} 5
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",\
resource="events",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",\
resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 100
apiserver_request_duration_seconds_count{resource="checkpointrollouts",verb="GET"} 5
"""


@pytest.mark.parametrize(
    ("waves", "targets"),
    [(1, ["100%"]), (3, ["33%", "67%", "100%"]), (4, ["25%", "50%", "75%", "100%"])],
)
def test_waves_are_evenly_spaced_percents_ending_at_100(waves: int, targets: list[str]) -> None:
    assert wave_targets(waves) == targets


def test_request_counts_by_verb_and_resource_for_the_chosen_resources() -> None:
    counts = request_counts(METRICS, ("checkpointrollouts", "events"))
    assert counts == Counter(
        {"PATCH checkpointrollouts/status": 9, "GET checkpointrollouts": 5, "POST events": 3}
    )


def test_delta_keeps_what_changed() -> None:
    before = Counter({"GET checkpointrollouts": 5, "POST events": 3})
    after = Counter({"GET checkpointrollouts": 9, "POST events": 3, "PATCH checkpointrollouts/status": 2})
    assert delta(after, before) == Counter(
        {"GET checkpointrollouts": 4, "PATCH checkpointrollouts/status": 2}
    )


def test_overhead_is_what_the_slowest_loads_of_each_wave_do_not_explain() -> None:
    assert overhead_per_wave(10.0, [1.0, 2.0, 3.0, 0.0], 4) == pytest.approx(1.0)


def test_summary_states_ratios_against_the_targets() -> None:
    result = {
        "workers": 100,
        "waves": 4,
        "agent_reports": True,
        "phase": "Succeeded",
        "total_s": 2.0,
        "overhead_per_wave_s": 0.5,
        "api_requests": 40,
        "operator_status_requests": 29,
        "agent_api_requests": 200,
        "agent_api_requests_at_succeeded": 150,
        "operator_rss_mb": 150.0,
        "ideal_wave_s": 0.1,
        "operator_cpu_ms_per_worker": 0.25,
        "idle_api_requests_per_min": 0.0,
    }
    text = "\n".join(summary_lines(result))
    assert "0.250 ms per worker" in text
    assert "idle CR: 0.0 operator API requests per minute" in text
    assert "0.50x the 1s target" in text
    assert "0.50x the 300 MB target" in text
    assert "0.400 per worker" in text
    assert "5.0x that" in text


def test_registered_on_the_cli() -> None:
    args = build_parser().parse_args(["controlplane", "--workers", "5000", "--waves", "4", "--json"])
    assert (args.workers, args.waves, args.json, args.agent_reports) == (5000, 4, True, True)
    assert args.idle_seconds == 60.0
    assert callable(args.func)
