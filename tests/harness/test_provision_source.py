"""Programs of ours built like the control plane (e2e/kstatus): cached under a hash of their
source, so an edit rebuilds them and nothing else does (no Go build, no network)."""

from __future__ import annotations

from pathlib import Path

from ckpt_e2e import provision, versions


def _program(root: Path) -> Path:
    root.mkdir()
    (root / "go.mod").write_text("module example.local/p\n\ngo 1.26\n")
    (root / "main.go").write_text("package main\n\nfunc main() {}\n")
    return root


def test_the_cache_key_follows_go_mod_and_go_files_only(tmp_path: Path) -> None:
    program = _program(tmp_path / "p")
    key = versions.source_version(program)
    (program / "README.md").write_text("notes\n")
    assert versions.source_version(program) == key
    (program / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    edited = versions.source_version(program)
    assert edited != key
    (program / "go.mod").write_text("module example.local/p\n\ngo 1.26\n\nrequire x.local/y v1.0.0\n")
    assert versions.source_version(program) not in {key, edited}


def test_kstatus_is_built_from_its_directory_and_cached_by_its_hash() -> None:
    component = versions.BINARIES["kstatus"]
    assert component.source == versions.KSTATUS_SOURCE
    assert component.version == versions.source_version(versions.KSTATUS_SOURCE)
    assert provision.cached_path("kstatus").parent.name == component.version
