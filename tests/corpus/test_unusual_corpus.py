"""Correct parallel programs written outside the rules' comfort zone (public frameworks' patterns,
unusual/parallel.py): shardproof proves every one."""

from __future__ import annotations

import json

import pytest
from ground_truth import CORPUS, RECORD, checks, run

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

NAMES = [check["name"] for check in checks()]


def test_every_program_of_the_corpus_is_correct_on_a_real_gloo_group() -> None:
    record = json.loads(RECORD.read_text())
    for check in checks():
        for world_size in check["world-sizes"]:
            entry = record[check["name"]][str(world_size)]
            assert entry["agree"] and entry["max_rel"] < 1e-9, (check["name"], world_size, entry)
    assert len(NAMES) >= 10


@pytest.mark.parametrize("name", ["round-robin", "padded-vocabulary"])
def test_the_recorded_ground_truth_still_holds(name: str) -> None:
    """A sample rerun of the real gloo runs (the whole corpus: `python tests/corpus/ground_truth.py`)."""
    (check,) = [c for c in checks() if c["name"] == name]
    for world_size in check["world-sizes"]:
        assert run(check, world_size) < 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_a_correct_program_is_verified(name: str, sandbox) -> None:
    project = load_project(CORPUS)
    result = verify_check(project.check(name), project, None, sandbox)
    assert result.error is None, result.error
    for outcome in result.results:
        assert outcome.verdict == "verified", (name, outcome.world_size, outcome.summary)
        assert not outcome.discrepancies and not outcome.unproven
