"""`bench release`'s pure parts: the model size it writes, its --waves, its verdict line."""

from __future__ import annotations

import pytest

from ckpt_e2e.bench.cli import build_parser
from ckpt_e2e.bench.release import HIDDEN, fits_in_memory, format_report, layers_for, parse_waves


@pytest.mark.parametrize(
    ("text", "waves"),
    [("100%", ["100%"]), ("1,100%", [1, "100%"]), (" 1, 25% ,100% ", [1, "25%", "100%"])],
)
def test_waves_parse_as_the_cr_writes_them(text: str, waves: list[int | str]) -> None:
    assert parse_waves(text) == waves


def test_a_wave_neither_count_nor_percent_is_refused() -> None:
    with pytest.raises(ValueError, match="half"):
        parse_waves("1,half")


@pytest.mark.parametrize(("size_mb", "layers"), [(1, 1), (14, 1), (22, 2), (512, 37), (1024, 73)])
def test_the_model_is_the_nearest_whole_number_of_layers(size_mb: int, layers: int) -> None:
    assert layers_for(size_mb) == layers
    layer = 7 * HIDDEN * HIDDEN * 2  # seven BF16 projections: 14 MiB
    assert layers == 1 or abs(layers * layer - size_mb * 2**20) <= layer // 2


def _report(ratio: float) -> dict[str, object]:
    return {
        "hosts": 8, "size_mb": 1024.0, "link_mbps": 200.0, "link_goodput_mbps": 190.0,
        "waves": ["100%"], "publish_s": 0.5, "publish_gbps": 2.1, "publish_bound_s": 0.1, "cores": 2,
        "digests_gbps_one_core": 5.0, "first_serving_s": 40.0, "s_over_bw_s": 45.0,
        "all_serving_s": 50.0, "released_s": 52.0, "released_over_bound": 1.15, "bound_s": 45.1,
        "time_to_fleet_over_bound": ratio, "target": 1.5,
    }  # fmt: skip


@pytest.mark.parametrize(("ratio", "mark"), [(1.1, "[ok  ]"), (1.5, "[ok  ]"), (1.51, "[MISS]")])
def test_the_verdict_holds_time_to_fleet_to_the_target(ratio: float, mark: str) -> None:
    verdict = format_report(_report(ratio)).splitlines()[-1]
    assert verdict.lstrip().startswith(mark)
    assert f"= {ratio:.2f}" in verdict


def test_release_is_a_bench_command_with_the_issue_defaults() -> None:
    args = build_parser().parse_args(["release"])
    assert (args.hosts, args.size_mb, args.link_mbps, args.waves) == (8, 1024, 200, "100%")


GiB = 2**30


@pytest.mark.parametrize(
    ("hosts", "size_mb", "available", "fits"),
    [
        # 8 agents x 3 copies x 1 GiB + 8 x 256 MiB + 2 GiB = 28 GiB: 23 GiB holds 768 MiB versions.
        (8, 1024, 23 * GiB, 768),
        (8, 1024, 28 * GiB, 1024),
        (2, 24, 4 * GiB, 24),
        (8, 1024, 2 * GiB, 0),
    ],
)
def test_the_size_is_refused_down_to_what_the_agents_can_hold(
    hosts: int, size_mb: int, available: int, fits: int
) -> None:
    assert fits_in_memory(hosts, size_mb, available) == fits
