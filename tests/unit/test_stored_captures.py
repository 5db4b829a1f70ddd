"""Stored captures are checked against the files as the editor sees them (unsaved buffers) and
the environment variables read; a damaged entry is captured again, never trusted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardproof.capture import environment
from shardproof.capture.capture_cache import CaptureCache, describe_inputs
from shardproof.config import load_project

FILE = "/project/parallel.py"


@pytest.fixture
def cache_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_root: Path):
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", str(tmp_path / "cache"))
    project = load_project(tiny_root)
    check = project.checks[0]

    def make(buffers: dict[str, str], variables: dict[str, str] | None = None) -> CaptureCache:
        inputs = (torch.empty(2, 3, device="meta"),)
        return CaptureCache(check, project, 2, inputs, buffers.get, variables or {})

    return make


def test_a_capture_holds_while_the_buffer_it_read_is_unchanged(cache_factory) -> None:
    buffers = {FILE: "x = 1\n"}
    cache_factory(buffers).store("rank0", {"pieces": 0}, {FILE})
    assert cache_factory(buffers).lookup("rank0") == {"pieces": 0}
    assert cache_factory(buffers).lookup("rank1") is None
    assert cache_factory({FILE: "x = 2\n"}).lookup("rank0") is None  # an unsaved edit
    cache_factory({FILE: "x = 2\n"}).store("rank0", {"pieces": 2}, {FILE})
    assert cache_factory(buffers).lookup("rank0") == {"pieces": 0}  # the edit undone
    assert cache_factory({}).lookup("rank0") is None  # the file is gone


def test_a_capture_holds_while_the_variables_read_keep_their_values(cache_factory) -> None:
    environment.add_names({"CAPTURE_CACHE_TEST_LAYERS"})
    buffers = {FILE: "x = 1\n"}
    cache_factory(buffers, {"CAPTURE_CACHE_TEST_LAYERS": "2"}).store("rank0", "two", {FILE})
    assert cache_factory(buffers, {"CAPTURE_CACHE_TEST_LAYERS": "2"}).lookup("rank0") == "two"
    assert cache_factory(buffers, {"CAPTURE_CACHE_TEST_LAYERS": "3"}).lookup("rank0") is None
    assert cache_factory(buffers, {}).lookup("rank0") is None  # unset


def test_a_key_keeps_its_most_recent_entries_and_a_damaged_one_is_not_used(cache_factory, tmp_path) -> None:
    for version in range(6):
        cache_factory({FILE: f"x = {version}\n"}).store("rank0", version, {FILE})
    assert cache_factory({FILE: "x = 5\n"}).lookup("rank0") == 5
    assert cache_factory({FILE: "x = 0\n"}).lookup("rank0") is None  # dropped: the oldest
    assert len(list((tmp_path / "cache" / "captures").glob("*/*.json"))) == 4
    for entry in (tmp_path / "cache" / "captures").glob("*/*.pickle"):
        entry.write_bytes(b"damaged")
    assert cache_factory({FILE: "x = 5\n"}).lookup("rank0") is None


def test_the_inputs_are_part_of_the_key() -> None:
    assert describe_inputs((torch.empty(2, 3),)) != describe_inputs((torch.empty(2, 4),))
    assert describe_inputs((torch.empty(2, 3),)) != describe_inputs((torch.empty(2, 3, dtype=torch.int64),))
