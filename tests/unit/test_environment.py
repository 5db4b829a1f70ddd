"""A stored result of the command line depends on the environment variables its capture read:
it is reused while they are unchanged and never after one of them changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardproof.capture import environment
from shardproof.capture.forked import map_ranks
from shardproof.verify import cache


@pytest.fixture(autouse=True)
def fresh_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "_names", set())


def _run_as(file: str, source: str) -> object:
    """Run `source` as if it were code of `file` (the reader's file decides whose read it is)."""
    scope: dict[str, object] = {"os": os}
    exec(compile(source, file, "exec"), scope)
    return scope.get("result")


def test_variables_read_by_key_are_recorded_only_while_user_code_runs(tmp_path: Path) -> None:
    os.environ.get("READ_BEFORE")
    with environment.recording([str(tmp_path)]):
        _run_as(str(tmp_path / "model.py"), "result = os.environ.get('MODEL_LAYERS', '2')")
        _run_as(str(tmp_path / "model.py"), "result = 'MODEL_DIM' in os.environ")
        _run_as(str(tmp_path / "model.py"), "result = os.getenv('MODEL_HEADS')")
        _run_as(str(tmp_path / "model.py"), "result = os.getenv('SHARDPROOF_JOBS')")  # our own setting
    os.environ.get("READ_AFTER")
    assert environment.names_read() == {"MODEL_LAYERS", "MODEL_DIM", "MODEL_HEADS"}


def test_the_project_walking_the_environment_reads_all_of_it_a_library_scan_does_not(tmp_path: Path) -> None:
    with environment.recording([str(tmp_path / "project")]):
        _run_as("/usr/lib/python3/site-packages/somelib/config.py", "result = dict(os.environ)")
        assert environment.EVERYTHING not in environment.names_read()
        _run_as(str(tmp_path / "project" / "launch.py"), "result = os.environ.copy()")
    assert environment.EVERYTHING in environment.names_read()


def test_reads_of_a_forked_capture_count_as_this_processes() -> None:
    def capture(rank: int) -> str | None:
        with environment.recording(["/nowhere"]):
            return os.environ.get(f"RANK_SETTING_{rank}")

    map_ranks(capture, 4, 2)
    assert {"RANK_SETTING_1", "RANK_SETTING_3"} <= environment.names_read()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_result_is_reused_while_the_variables_it_read_are_unchanged(tmp_path: Path, cache_dir: Path) -> None:
    source = tmp_path / "model.py"
    source.write_text("LAYERS = 2\n")
    started = {"MODEL_LAYERS": "4", "TERM": "xterm"}
    cache.store_result("k", {"verdict": "verified"}, {str(source)}, {"MODEL_LAYERS", "MODEL_DIM"}, started)
    assert cache.cached_result("k", started) == {"verdict": "verified"}
    assert cache.cached_result("k", started | {"TERM": "dumb", "PWD": "/elsewhere"}) is not None
    assert cache.cached_result("k", started | {"MODEL_LAYERS": "126"}) is None
    assert cache.cached_result("k", started | {"MODEL_DIM": "64"}) is None  # unset then, set now
    assert cache.cached_result("k", {"TERM": "xterm"}) is None  # set then, unset now


def test_a_result_that_read_the_whole_environment_needs_all_of_it_unchanged(tmp_path: Path, cache_dir: Path) -> None:
    started = {"MODEL_LAYERS": "4", "TERM": "xterm", "SHARDPROOF_JOBS": "2"}
    cache.store_result("k", {"verdict": "verified"}, set(), {environment.EVERYTHING}, started)
    assert cache.cached_result("k", started) is not None
    assert cache.cached_result("k", started | {"SHARDPROOF_JOBS": "1"}) is not None
    assert cache.cached_result("k", started | {"TERM": "dumb"}) is None
    assert cache.cached_result("k", started | {"NEW": "1"}) is None
