"""Mixture of experts as transformers writes it (tests/fixtures/hf_moe): a tiny Mixtral with its
built-in tensor-parallel plan. Its experts run transformers' grouped-matmul loop (an opaque
custom op) and gather tokens with `index.Tensor`; their relations come from laws derived from
DTensor's sharding strategies (verify/op_laws.py), each checked on concrete tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "hf_moe"


def test_the_built_in_moe_plan_is_verified(sandbox) -> None:
    project = load_project(ROOT)
    result = verify_check(project.check("hf-mixtral-tp"), project, None, sandbox)
    assert result.error is None, result.error
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]


def test_a_fused_expert_weight_planned_as_one_block_is_a_shown_discrepancy(sandbox) -> None:
    """colwise instead of packed_colwise for the experts' [gate; up]: rank 0 holds only gate rows.
    The numeric witness runs the plan with real numbers and the outputs differ: a discrepancy."""
    project = load_project(ROOT)
    result = verify_check(project.check("hf-mixtral-fused-as-one-block"), project, None, sandbox)
    (outcome,) = result.results
    assert outcome.verdict == "discrepancy", outcome.summary
    (finding,) = outcome.discrepancies
    assert finding.witness["status"] == "confirmed", finding.witness
    assert "grouped_mm_fallback" in finding.message
