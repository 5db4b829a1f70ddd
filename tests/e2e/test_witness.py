"""Numeric witnesses and the static/numeric cross-check on the tiny checks.

Every check that is verified statically must be numerically equal; every discrepancy must come
with real numbers that differ, or say why there are none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check
from shardproof.witness import numeric
from shardproof.witness.describe import describe
from shardproof.witness.run import compare_numerically, witness

pytestmark = pytest.mark.slow

CROSS_CHECKED = [
    "ok",
    "column-only",
    "column-only-replicated",
    "fresh",
    "fresh-declared",  # verified under its declaration; the numbers run under it too
    "reduce-scatter",
    "broadcast",
    "all-to-all",
    "truncate-before-reduce",
    "bias-on-first-rank",  # the bias added once, on rank 0, before the all-reduce
    "spelled-matmul-transpose",  # linears spelled torch.matmul(x, W.transpose(-1, -2)), x @ W.t(), einsum
    "spelled-at-t",
    "spelled-einsum",
    "sequence-parallel-layernorm",
    "vocab-parallel-softmax",
]


@pytest.mark.parametrize("name", CROSS_CHECKED)
def test_static_and_numeric_verdicts_agree(name: str, tiny_root: Path, sandbox) -> None:
    project = load_project(tiny_root)
    check = project.check(name)
    for outcome in verify_check(check, project, None, sandbox).results:
        if outcome.verdict == "verified":
            numbers = compare_numerically(check, project, outcome.world_size)
            assert not numbers.differs, (
                f"{name} at world size {outcome.world_size} is proven equal but differs numerically: "
                f"{numbers.to_dict()}"
            )
        elif outcome.verdict == "discrepancy":
            found = outcome.discrepancies[0].witness
            assert found is not None and found["status"] == "confirmed", (
                f"{name} at world size {outcome.world_size}: discrepancy without numbers that differ: {found}"
            )
        else:
            pytest.fail(f"{name}: {outcome.verdict}: {outcome.summary}")


def test_a_model_too_large_to_run_gives_no_witness_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bug_variants

    project = load_project(bug_variants.materialize(bug_variants.variant("missing-all-reduce"), tmp_path / "v"))
    monkeypatch.setattr(numeric, "MAX_PARAMETER_ELEMENTS", 1000)
    found = witness(project.checks[0], project, 2)
    assert found["status"] == "not-run"
    assert "too many to run with real numbers" in found["reason"]
    assert describe(found)[0].startswith("not run: full configuration: the model has")


def test_a_rank_that_fails_with_real_numbers_gives_the_reason(tiny_root: Path) -> None:
    project = load_project(tiny_root)
    found = witness(project.check("builder-raises"), project, 2)
    assert found["status"] == "not-run"
    assert "rank" in found["reason"] and "failed" in found["reason"]


def test_a_failed_run_does_not_spoil_the_next_one(tiny_root: Path) -> None:
    """The worker process lives on between verifications: a run whose rank failed (and woke the
    others) must leave the next run's collectives working."""
    project = load_project(tiny_root)
    assert witness(project.check("builder-raises"), project, 2)["status"] == "not-run"
    numbers = compare_numerically(project.check("ok"), project, 2)
    assert not numbers.differs, numbers.to_dict()


def test_a_model_whose_kernels_refuse_float64_is_run_in_float32() -> None:
    """transformers' grouped-matmul experts raise "Expected mat_a to be Float32, BFloat16 or Float16
    matrix, got Double": the witness runs the model in float32 with its tolerance, and never raises."""
    root = Path(__file__).resolve().parents[1] / "fixtures" / "hf_moe"
    project = load_project(root)
    found = witness(project.checks[0], project, 2, "model.model.layers.0.mlp")
    assert found["status"] == "agree", found
    assert found["dtype"] == "float32" and found["tolerance"] == 1e-4
    assert any("Double" in note for note in found["notes"]), found["notes"]
