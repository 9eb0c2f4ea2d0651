"""docs/reference/ is generated from the models (ckpt_e2e.reference_docs): the committed pages are
what the models render now, and each page lists what its model holds."""

from __future__ import annotations

from pathlib import Path

from ckpt_e2e import reference_docs

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference"


def test_the_committed_pages_are_what_the_models_render() -> None:
    stale = [name for name, text in reference_docs.render().items() if (DOCS / name).read_text() != text]
    assert not stale, f"docs/reference/{stale} differ from the models: run `make generate`"


def test_every_spec_field_of_the_crd_has_a_row_with_its_default() -> None:
    page = reference_docs.checkpointrollout_page()
    for row in (
        "| `spec.strategy.relayFanout` | integer | `1` |",
        "| `spec.source.uri` | string | required |",
    ):
        assert row in page
    assert "| `spec.selector.matchExpressions[].operator` | string | required |" in page


def test_metrics_carry_their_exposed_names_and_labels() -> None:
    page = reference_docs.metrics_page()
    assert "| `ckpt_agent_loads_total` | counter | `result`, `reason` |" in page
    assert "| `ckpt_rollout_phase` | gauge | `namespace`, `name`, `phase` |" in page
    assert "ckpt_agent_loads_total_total" not in page


def test_every_agent_setting_has_its_key_flag_and_default() -> None:
    from ckpt_agent.settings import AgentSettings

    page = reference_docs.agent_settings_page()
    for key in AgentSettings.model_fields:
        assert f"| `{key}` | `--{key.replace('_', '-')}` |" in page
    assert "| `chunk_mb` | `--chunk-mb` | `4` |" in page


def test_check_mode_names_a_stale_page(tmp_path: Path) -> None:
    assert reference_docs.main([str(tmp_path)]) == 0
    assert reference_docs.main([str(tmp_path), "--check"]) == 0
    (tmp_path / "metrics.md").write_text("old\n")
    assert reference_docs.main([str(tmp_path), "--check"]) == 1


def test_a_cell_cannot_break_its_table() -> None:
    assert reference_docs._cell("a | b\n c") == "a \\| b c"
