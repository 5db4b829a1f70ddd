"""Mixture of experts (examples/moe): expert parallelism with all-to-all dispatch and combine
over unevenly divided experts, and tensor-parallel experts with a shared expert reduced together
with the routed output, are verified; routing weights paired with the wrong slots, a shared
expert reduced twice and combine split sizes swapped are found at their lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_scripts import load_script

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moe"


bug_variants = load_script(EXAMPLE / "bug_variants.py", "moe_bug_variants")


@pytest.mark.parametrize("name", ["moe-ep", "moe-tp"])
def test_moe_is_verified_at_2_and_4_ranks(name: str, sandbox) -> None:
    project = load_project(EXAMPLE)
    result = verify_check(project.check(name), project, [2, 4], sandbox)
    assert result.error is None
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]
    assert all(o.relation == "replicated" for r in result.results for o in r.outputs)


@pytest.fixture(scope="module")
def variant_projects(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-variants")
    return {v.name: bug_variants.materialize(v, root / v.name) for v in bug_variants.VARIANTS}


@pytest.mark.parametrize(
    ("name", "kind", "world_size"),
    [
        ("weights-paired-with-wrong-experts", "wrong-layout", 2),
        ("weights-paired-with-wrong-experts", "wrong-layout", 4),
        ("shared-expert-reduced-twice", "duplicate-reduction", 2),
        ("shared-expert-reduced-twice", "duplicate-reduction", 4),
        ("combine-splits-swapped", "collective-mismatch", 4),
    ],
)
def test_moe_mistake_is_reported_at_its_line(
    name: str, kind: str | None, world_size: int, variant_projects: dict[str, Path], sandbox
) -> None:
    bug = bug_variants.variant(name)
    root = variant_projects[name]
    project = load_project(root)
    (outcome,) = verify_check(project.check(bug.check), project, [world_size], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    if kind is not None:
        assert finding.kind == kind, finding.message
    assert finding.primary is not None, finding.message
    assert finding.primary.file.endswith(bug_variants.PARALLEL)
    assert finding.primary.line == bug.line_number(root), finding.message
    if name == "combine-splits-swapped":
        assert "input_split_sizes [2, 2, 1, 1] add up to 6 rows but the input has 8" in finding.message


def test_swapped_splits_are_harmless_when_every_rank_holds_as_many_experts(variant_projects, sandbox) -> None:
    """6 experts over 2 ranks: both split lists are [3, 3], so the swapped call is the same call."""
    root = variant_projects["combine-splits-swapped"]
    project = load_project(root)
    (outcome,) = verify_check(project.check("moe-ep"), project, [2], sandbox).results
    assert outcome.verdict == "verified", outcome.summary


def test_data_dependent_dispatch_is_an_error_at_its_line(tmp_path: Path, sandbox) -> None:
    """Dropless routing (token counts as sizes) cannot be captured with static shapes: an error at
    the line that reads the counts, never a verdict."""
    import shutil

    root = tmp_path / "dropless"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__", "bug_variants.py"))
    parallel = root / bug_variants.PARALLEL
    original = "received = all_to_all(expert_in, send=self.per_rank, receive=[self.n_local] * ranks)"
    counted = "kept = [int(n) for n in slots.sum(dim=(0, 1, 2, 4)).long().tolist()]"
    text = parallel.read_text()
    assert original in text
    parallel.write_text(text.replace(original, counted + "\n        " + original))
    line = 1 + parallel.read_text().splitlines().index("        " + counted)
    project = load_project(root)
    (outcome,) = verify_check(project.check("moe-ep"), project, [2], sandbox).results
    assert outcome.verdict == "error", outcome.summary
    assert "depends on the data" in outcome.error["message"]
    assert outcome.error["site"]["line"] == line
