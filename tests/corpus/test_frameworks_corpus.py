"""Correct parallel programs in the patterns of public frameworks (vLLM, SGLang, Megatron-LM,
nanotron, picotron, torchtitan, gpt-fast; frameworks/frameworks/*.py): shardproof proves every one
but the known gaps below, which it reports `unproven` (never a discrepancy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ground_truth import checks, record_path, run

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parent / "frameworks"
NAMES = [check["name"] for check in checks(CORPUS)]

# Unproven findings whose report names no line of the program (the localizer finds no rank value
# to blame): a gap in the report, not in the verdict, kept visible here until the localizer
# points at the first rank value that lacks a relation.
WITHOUT_SITE: dict[str, str] = {}

# Programs the relation algebra cannot prove yet, each with what it lacks. A program that becomes
# verified fails its test until it is taken off this list, so the list only shrinks.
KNOWN_GAPS: dict[str, str] = {
    "expert-parallel-tensor-parallel-tokens": (
        "the experts run on the received slots regrouped by a view ([ranks, experts, slots, hidden]) and "
        "chunked per expert, each multiplied by its own 2-D weight, where the reference multiplies the "
        "whole [experts, slots, hidden] batch by the batched weights: no rule carries a batched matmul "
        "through the view that splits the slots and the per-expert selection of a batched weight (the "
        "exchange itself is read: a view of the expert's slots concatenated over the ranks)"
    ),
    "vllm-fused-moe-tensor-parallel": (
        "each rank's gate and up blocks are concatenated into one stacked weight (w13), and the einsum is "
        "lowered as a matmul over the expert and intermediate dims merged by a view: the merged dim "
        "interleaves blocks of two reference weights, which no relation states (the same experts with "
        "gate and up kept apart, stacked-experts-tensor-parallel, are verified)"
    ),
}

_RESULTS: dict[str, object] = {}


def _verified(name: str, sandbox) -> object:
    """Each check verified once for the tests that read its result (a verification takes seconds)."""
    if name not in _RESULTS:
        project = load_project(CORPUS)
        _RESULTS[name] = verify_check(project.check(name), project, None, sandbox)
    return _RESULTS[name]


def test_every_program_of_the_corpus_is_correct_on_a_real_gloo_group() -> None:
    record = json.loads(record_path(CORPUS).read_text())
    for check in checks(CORPUS):
        for world_size in check["world-sizes"]:
            entry = record[check["name"]][str(world_size)]
            assert entry["agree"] and entry["max_rel"] < 1e-9, (check["name"], world_size, entry)
    assert len(NAMES) >= 20


@pytest.mark.parametrize("name", ["megatron-softmax", "torchtitan-sp"])
def test_the_recorded_ground_truth_still_holds(name: str) -> None:
    """A sample rerun of the real gloo runs: a rank keeping its vocabulary block of the output
    (`outputs = "sharded"`) and a DTensor plan (the whole corpus:
    `python tests/corpus/ground_truth.py --corpus frameworks`)."""
    (check,) = [c for c in checks(CORPUS) if c["name"] == name]
    for world_size in check["world-sizes"]:
        assert run(check, world_size, CORPUS) < 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_a_correct_program_is_verified_or_a_known_gap_never_a_discrepancy(name: str, sandbox) -> None:
    result = _verified(name, sandbox)
    assert result.error is None, result.error
    for outcome in result.results:
        expected = ("unproven", "inconclusive") if name in KNOWN_GAPS else ("verified",)
        assert outcome.verdict in expected, (name, outcome.world_size, outcome.summary)
        assert not outcome.discrepancies
        if outcome.verdict == "unproven":
            (finding,) = outcome.unproven
            assert finding.witness["status"] == "agree", finding.witness
            assert finding.message.startswith("not proven:") and "the numbers agree on" in finding.message
        if outcome.verdict == "inconclusive":
            (why,) = outcome.inconclusive
            assert why.op and why.site is not None, why  # names the operation and where


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(reason=WITHOUT_SITE[name], strict=True))
        if name in WITHOUT_SITE
        else name
        for name in NAMES
    ],
)
def test_an_unproven_program_is_reported_at_a_line_of_its_own(name: str, sandbox) -> None:
    """What the user reads first is the line of their code where the proof stopped."""
    result = _verified(name, sandbox)
    for outcome in result.results:
        for finding in outcome.unproven:
            assert finding.primary is not None and Path(finding.primary.file).is_relative_to(CORPUS), finding.primary
