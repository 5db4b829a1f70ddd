"""The language server's settings, and which configuration of a check the editor verifies."""

from __future__ import annotations

from pathlib import Path

from shardproof.config import parse_project
from shardproof.results import CheckResult
from shardproof.server.server import ProjectState, ShardproofLanguageServer
from shardproof.server.settings import Settings

DECLARATION = """
[tool.shardproof]
python-path = ["."]

[[tool.shardproof.check]]
name = "large"
reference = "pkg.model:build"
parallel = "pkg.tp:parallelize"
inputs = "pkg.model:inputs"
world-sizes = [2, 4, 8]

[tool.shardproof.check.quick]
reference = "pkg.model:build_small"
world-sizes = [2]

[[tool.shardproof.check]]
name = "small"
reference = "pkg.model:build"
parallel = "pkg.tp:parallelize"
inputs = "pkg.model:inputs"
world-sizes = [2]
"""


def test_the_editor_verifies_full_declarations_by_default() -> None:
    assert Settings().editor_configuration == "full"
    settings, problems = Settings.from_options({"debounceMs": 200})
    assert settings.editor_configuration == "full" and not problems


def test_the_quick_configuration_is_chosen_by_the_setting_also_nested_under_shardproof() -> None:
    settings, problems = Settings.from_options({"editorConfiguration": "quick"})
    assert settings.editor_configuration == "quick" and not problems
    settings, problems = Settings.from_options({"shardproof": {"editorConfiguration": "quick"}})
    assert settings.editor_configuration == "quick" and not problems
    back, problems = Settings.from_options({"editorConfiguration": "full"}, settings)
    assert back.editor_configuration == "full" and not problems


def test_a_bad_value_keeps_the_previous_choice_with_a_warning() -> None:
    settings, problems = Settings.from_options({"editorConfiguration": "fast", "debounceMs": 100})
    assert settings.editor_configuration == "full" and settings.debounce_ms == 100
    (problem,) = problems
    assert "shardproof.editorConfiguration must be one of full, quick" in problem and "'fast'" in problem
    quick, _ = Settings.from_options({"editorConfiguration": "quick"})
    kept, problems = Settings.from_options({"editorConfiguration": 3}, quick)
    assert kept.editor_configuration == "quick" and len(problems) == 1


def _server(tmp_path: Path, configuration: str) -> tuple[ShardproofLanguageServer, ProjectState]:
    server = ShardproofLanguageServer()
    server.settings, _ = Settings.from_options({"editorConfiguration": configuration})
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(DECLARATION)
    state = ProjectState(pyproject, parse_project(DECLARATION, pyproject))
    server.projects.append(state)
    return server, state


def test_the_quick_table_is_verified_only_when_asked_for_and_declared(tmp_path: Path) -> None:
    server, state = _server(tmp_path, "full")
    assert server.editor_mode(state, "large") == "full"
    assert server.editor_mode(state, "small") == "full"
    server, state = _server(tmp_path, "quick")
    assert server.editor_mode(state, "large") == "quick"
    # a check without a quick table has only its full declaration: its results say "full"
    assert server.editor_mode(state, "small") == "full"


def test_changing_the_setting_verifies_again_the_checks_whose_result_is_of_the_other_configuration(
    tmp_path: Path,
) -> None:
    server, state = _server(tmp_path, "full")
    state.results["large"] = ("full", CheckResult("large"))
    state.results["small"] = ("full", CheckResult("small"))
    scheduled: list[str] = []
    server.schedule = lambda s, check, delay: scheduled.append(check)  # type: ignore[method-assign]
    server.editor_configuration_changed()
    assert scheduled == []  # nothing changed for either check
    server.settings, _ = Settings.from_options({"editorConfiguration": "quick"}, server.settings)
    server.editor_configuration_changed()
    assert scheduled == ["large"]  # "small" has no quick table: its full result stands
