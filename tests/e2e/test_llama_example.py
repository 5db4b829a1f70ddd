"""The bundled Llama example: the correct version is verified; every bug variant is reported at its line."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.localize.picture import BROKEN, picture
from shardproof.pipeline import verify_check
from shardproof.witness.run import compare_numerically

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["llama-tp", "llama-sp", "llama-loss"])
def test_correct_example_is_verified_at_2_4_and_8(name: str, example_root: Path, sandbox) -> None:
    # llama-sp: the same model with sequence parallelism (all-gather and reduce-scatter on dim 1).
    # llama-loss (examples/llama_loss): its training loss (cross entropy with label smoothing) on
    # vocabulary-sharded logits.
    project = load_project(example_root.parent / "llama_loss" if name == "llama-loss" else example_root)
    result = verify_check(project.check(name), project, [2, 4, 8], sandbox)
    assert result.error is None
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified"), (8, "verified")]
    for r in result.results:
        assert [o.relation for o in r.outputs] == ["replicated"]
        assert r.stats["saturation_status"] == "fixpoint"
        # Cross-check: proven equal, so numerically equal too (float64, random weights, every input trial).
        numbers = compare_numerically(project.check(name), project, r.world_size)
        assert not numbers.differs, f"{name} at world size {r.world_size}: verified but {numbers.to_dict()}"
        assert all(o.max_rel < 1e-9 for o in numbers.outputs)


def _variant_cases() -> list[tuple[str, int]]:
    import bug_variants

    return [(v.name, w) for v in bug_variants.VARIANTS for w in v.world_sizes]


@pytest.fixture(scope="module")
def variant_projects(tmp_path_factory) -> dict[str, Path]:
    import bug_variants

    root = tmp_path_factory.mktemp("variants")
    return {v.name: bug_variants.materialize(v, root / v.name) for v in bug_variants.VARIANTS}


def test_there_are_at_least_ten_variants() -> None:
    import bug_variants

    assert len(bug_variants.VARIANTS) >= 10
    assert len({v.kind for v in bug_variants.VARIANTS}) >= 6


@pytest.mark.parametrize(("name", "world_size"), _variant_cases())
def test_bug_variant_is_reported_at_the_line_of_the_mistake(
    name: str, world_size: int, variant_projects, sandbox
) -> None:
    import bug_variants

    bug = bug_variants.variant(name)
    project = load_project(variant_projects[name])
    result = verify_check(project.checks[0], project, [world_size], sandbox)
    (outcome,) = result.results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.primary is not None
    assert Path(finding.primary.file) == variant_projects[name] / bug.file
    assert finding.primary.line == bug.line_number(variant_projects[name]), finding.message
    assert finding.primary.column is not None and finding.primary.end_column is not None
    assert finding.kind == bug.kind, finding.message
    assert finding.message and finding.expected and finding.found
    assert finding.reference is not None and finding.reference.file.endswith("model.py")

    # The explanation's picture: well-formed SVG naming a rank, with the broken link drawn in red.
    svg = picture(finding)
    root = ElementTree.fromstring(svg)
    assert root.tag.endswith("svg")
    texts = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    assert "rank" in texts and "reference" in texts, texts
    assert any(e.get("stroke") == BROKEN for e in root.iter()), "nothing is highlighted as broken"

    # Cross-check: the discrepancy is backed by real numbers that differ.
    assert finding.witness is not None and finding.witness["status"] == "confirmed", (
        f"{name} at world size {world_size}: a discrepancy without a numeric witness: {finding.witness}"
    )


@pytest.fixture(scope="module")
def sequence_parallel_projects(tmp_path_factory) -> dict[str, Path]:
    import bug_variants

    root = tmp_path_factory.mktemp("sp-variants")
    return {v.name: bug_variants.materialize(v, root / v.name) for v in bug_variants.SEQUENCE_PARALLEL_VARIANTS}


def _sequence_parallel_cases() -> list[tuple[str, int]]:
    import bug_variants

    return [(v.name, w) for v in bug_variants.SEQUENCE_PARALLEL_VARIANTS for w in v.world_sizes]


@pytest.mark.parametrize(("name", "world_size"), _sequence_parallel_cases())
def test_sequence_parallel_mistake_is_a_confirmed_discrepancy(
    name: str, world_size: int, sequence_parallel_projects, sandbox
) -> None:
    project = load_project(sequence_parallel_projects[name])
    (outcome,) = verify_check(project.checks[0], project, [world_size], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    witness = outcome.discrepancies[0].witness
    assert witness is not None and witness["status"] == "confirmed", witness


@pytest.mark.parametrize("name", ["sp-gather-as-reshape", "sp-scatter-without-regroup", "sp-missing-final-gather"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_mistake_is_reported_at_its_line(
    name: str, world_size: int, sequence_parallel_projects, sandbox
) -> None:
    import bug_variants

    bug = bug_variants.variant(name)
    project = load_project(sequence_parallel_projects[name])
    (outcome,) = verify_check(project.checks[0], project, [world_size], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.primary is not None
    assert finding.primary.file.endswith(bug.file), finding.primary
    assert finding.primary.line == bug.line_number(sequence_parallel_projects[name]), finding.message
    assert finding.kind == bug.kind


@pytest.fixture(scope="module")
def loss_projects(tmp_path_factory) -> dict[str, Path]:
    import bug_variants

    root = tmp_path_factory.mktemp("loss-variants")
    return {v.name: bug_variants.materialize(v, root / v.name) for v in bug_variants.LOSS_VARIANTS}


def _loss_cases() -> list[tuple[str, int]]:
    import bug_variants

    return [(v.name, w) for v in bug_variants.LOSS_VARIANTS for w in v.world_sizes]


@pytest.mark.parametrize(("name", "world_size"), _loss_cases())
def test_vocab_parallel_loss_mistake_is_confirmed_and_reported_at_its_line(
    name: str, world_size: int, loss_projects, sandbox
) -> None:
    import bug_variants

    bug = bug_variants.variant(name)
    project = load_project(loss_projects[name])
    (outcome,) = verify_check(project.checks[0], project, [world_size], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.primary is not None
    assert finding.primary.file.endswith(bug.file), finding.primary
    assert finding.primary.line == bug.line_number(loss_projects[name]), finding.message
    assert finding.kind == bug.kind
    assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness
