"""Gradients (examples/gradients): the parameter gradients of tensor-, sequence- and
data-parallel training steps (with gradient accumulation too), captured forward and backward
together, are verified against the reference's; a missing all-reduce in a custom backward, a norm
gradient left out of the sequence-parallel all-reduce, a detach that stops the gradients,
data-parallel gradients summed instead of averaged and micro-batch means added up are found at
their lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_scripts import load_script

from shardproof.capture.program import CheckCapture
from shardproof.config import load_project
from shardproof.pipeline import verify_check
from shardproof.witness.run import compare_gradients_numerically

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gradients"


bug_variants = load_script(EXAMPLE / "bug_variants.py", "gradient_bug_variants")


@pytest.mark.parametrize("name", ["grads-tp", "grads-sp", "grads-dp", "grads-accum"])
def test_every_gradient_is_verified_at_2_and_4_ranks(name: str, sandbox) -> None:
    project = load_project(EXAMPLE)
    result = verify_check(project.check(name), project, [2, 4], sandbox)
    assert result.error is None
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]
    for outcome in result.results:
        loss, *gradients = outcome.outputs
        assert loss.relation == "replicated"
        described = {o.description.split(":")[0] for o in gradients}
        # the frozen head has no gradient; every other parameter's is checked
        assert described == {
            f"gradient of `model.{name}`"
            for name in (
                "embed.weight",
                "layers.0.norm.weight",
                "layers.0.up.weight",
                "layers.0.down.weight",
                "layers.1.norm.weight",
                "layers.1.up.weight",
                "layers.1.down.weight",
                "norm.weight",
            )
        }
        assert all(o.relation == "gradient" for o in gradients)
        up = next(o for o in gradients if "layers.0.up.weight" in o.description)
        if name in ("grads-dp", "grads-accum"):  # replicated parameters: every rank the whole gradient
            assert "every rank holds the full reference gradient" in up.description, up.description
            continue
        blocks = ", ".join(
            f"[{r * 32 // outcome.world_size}:{(r + 1) * 32 // outcome.world_size}]" for r in range(outcome.world_size)
        )
        assert up.description.endswith(blocks)


@pytest.mark.parametrize("name", ["grads-tp", "grads-sp", "grads-dp", "grads-accum"])
def test_verified_gradients_agree_with_real_numbers(name: str) -> None:
    # the numeric counterpart of the proofs: the training steps on threads, in float64
    project = load_project(EXAMPLE)
    capture = CheckCapture(project.check(name), project)
    for world_size in (2, 4):
        roles = [rank.graph.gradient_roles for rank in capture.capture(world_size).ranks]
        numbers = compare_gradients_numerically(project.check(name), project, world_size, roles)
        compared = {d.where for d in numbers.outputs}
        assert "gradient of model.layers.0.up.weight" in compared and "output 0" in compared
        assert "gradient of model.head.weight" not in compared  # frozen
        assert not numbers.differs, [d for d in numbers.outputs if d.differs]


@pytest.fixture(scope="module")
def variant_projects(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gradient-variants")
    return {v.name: bug_variants.materialize(v, root / v.name) for v in bug_variants.VARIANTS}


@pytest.mark.parametrize(
    ("name", "kind", "world_size"),
    [
        ("partial-input-gradient", "partial-sum-into-nonlinear", 2),
        ("partial-input-gradient", "partial-sum-into-nonlinear", 4),
        ("final-norm-gradient-not-reduced", "missing-reduction", 2),
        ("final-norm-gradient-not-reduced", "missing-reduction", 4),
        ("frozen-head-stops-gradients", "missing-gradient", 2),
        ("frozen-head-stops-gradients", "missing-gradient", 4),
        ("gradients-summed-not-averaged", "scaled-gradient", 2),
        ("gradients-summed-not-averaged", "scaled-gradient", 4),
        ("micro-batch-means-summed", "scaled-gradient", 2),
        ("micro-batch-means-summed", "scaled-gradient", 4),
    ],
)
def test_gradient_mistake_is_reported_at_its_line(
    name: str, kind: str, world_size: int, variant_projects: dict[str, Path], sandbox
) -> None:
    bug = bug_variants.variant(name)
    root = variant_projects[name]
    project = load_project(root)
    (outcome,) = verify_check(project.check(bug.check), project, [world_size], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.kind == kind, finding.message
    assert finding.primary is not None, finding.message
    assert finding.primary.file.endswith(bug.reported_file)
    assert finding.primary.line == bug.line_number(root), finding.message
    if name == "final-norm-gradient-not-reduced":
        assert "the gradient of `model.norm.weight`" in finding.message
        assert "all-reduce this gradient" in finding.suggestion
    if name == "frozen-head-stops-gradients":
        assert "computes no gradient" in finding.message and finding.ranks == list(range(world_size))
    if name == "gradients-summed-not-averaged":
        assert f"is {world_size} × the reference's" in finding.message, finding.message
        assert "summed where they should be averaged" in finding.message
    if name == "micro-batch-means-summed":
        # two micro-batches per rank: each mean is twice the rank's share of the step's mean
        assert "is 2 × the reference's" in finding.message and "micro-batch" in finding.message, finding.message
    # the training steps run with real numbers: the gradient the finding names differs
    assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness
    differing = [d for d in finding.witness["outputs"] if d["max_rel"] is None or d["max_rel"] > 1e-6]
    assert any(d["where"].startswith("gradient of model.") for d in differing), differing
