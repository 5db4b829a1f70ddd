"""Verdicts and messages users rely on, on tiny models: sharded outputs, overrides, unrelated
parameters, unsupported ops, bounds, collective mismatches and errors in user code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.localize.picture import picture
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tiny_root: Path):
    return load_project(tiny_root)


def run(project, name: str, sandbox, world_sizes=None, **changes):
    check = project.check(name)
    if changes:
        check = dataclasses.replace(check, **changes)
    return verify_check(check, project, world_sizes, sandbox)


def line_of(path: Path, text: str) -> int:
    return next(i + 1 for i, line in enumerate(path.read_text().splitlines()) if text in line)


def test_correct_mlp_is_verified(tiny, sandbox) -> None:
    result = run(tiny, "ok", sandbox)
    assert [r.verdict for r in result.results] == ["verified", "verified"]


def test_sharded_outputs_are_verified_with_the_relation_found(tiny, sandbox) -> None:
    (outcome,) = run(tiny, "column-only", sandbox).results
    assert outcome.verdict == "verified"
    assert outcome.outputs[0].relation == "sharded"
    assert "[0:16], [16:32]" in outcome.outputs[0].description


def test_sharded_outputs_fail_a_replicated_expectation(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "column-only-replicated", sandbox).results
    assert outcome.verdict == "discrepancy"
    (finding,) = outcome.discrepancies
    assert finding.kind == "wrong-layout"
    assert finding.primary.line == line_of(tiny_root / "tinymlp/parallel.py", "return F.linear(x, self.w, self.b)")


def test_integer_cast_of_a_partial_sum_is_a_discrepancy_at_the_cast(tiny, sandbox, tiny_root) -> None:
    # Truncating each rank's partial sum is not truncating their sum: casts to integers are not linear.
    (outcome,) = run(tiny, "truncate-before-reduce", sandbox).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "partial-sum-into-nonlinear"
    assert "cast to int64" in finding.message
    assert finding.primary.line == line_of(tiny_root / "tinymlp/parallel.py", ".to(torch.int64)")


def test_independently_initialised_parameter_is_a_discrepancy_at_its_creation(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "fresh", sandbox).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "unrelated-parameter"
    assert finding.primary.line == line_of(tiny_root / "tinymlp/parallel.py", "self.down_w = nn.Parameter(torch.randn")


def test_declared_relation_overrides_independent_initialisation(tiny, sandbox) -> None:
    (outcome,) = run(tiny, "fresh-declared", sandbox).results
    assert outcome.verdict == "verified"


def test_unsupported_op_is_inconclusive_and_says_which_op_and_where(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "unsupported-op", sandbox).results
    assert outcome.verdict == "inconclusive"
    (reason,) = outcome.inconclusive
    assert reason.reason == "unsupported-op"
    # a custom kernel: no decomposition, no DTensor strategy (an aten op would get derived laws)
    assert "log_gamma" in reason.op and "log_gamma" in reason.message
    assert reason.site is not None
    assert reason.site.line == line_of(tiny_root / "tinymlp/model.py", "log_gamma(self.up(x))")


def test_past_an_unsupported_op_outputs_that_differ_on_real_numbers_are_a_discrepancy(tiny, sandbox, tiny_root) -> None:
    # the correct program stays inconclusive (its numbers agree); one whose numbers differ is a
    # discrepancy the numbers alone show, at the op the rules do not follow
    wrong = "tinymlp.parallel:parallel_lgamma_wrong_rows"
    (outcome,) = run(tiny, "unsupported-op", sandbox, parallel=wrong).results
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert found.kind == "not-equivalent" and found.details.get("unpinned")
    assert found.message.startswith("the outputs differ from the reference's on real numbers")
    assert "log_gamma" in found.message
    assert (found.witness or {}).get("status") == "confirmed"
    assert found.primary is not None
    assert found.primary.line in (
        line_of(tiny_root / "tinymlp/model.py", "log_gamma(self.up(x))"),
        line_of(tiny_root / "tinymlp/parallel.py", "return log_gamma(F.linear"),
    )


def test_a_hit_bound_is_inconclusive_and_names_the_bound(tiny, sandbox) -> None:
    check = tiny.check("ok")
    (outcome,) = run(tiny, "ok", sandbox, [2], bounds=dataclasses.replace(check.bounds, iterations=1)).results
    assert outcome.verdict == "inconclusive"
    assert "iteration bound (1)" in outcome.inconclusive[0].message


def test_collective_mismatch_is_reported_at_both_calls(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "collective-mismatch", sandbox).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "collective-mismatch"
    source = tiny_root / "tinymlp/parallel.py"
    assert finding.primary.line == line_of(source, "if self.rank == 0:") + 1  # its dist.all_reduce(y)
    assert finding.related[0].line == line_of(source, "dist.all_gather_into_tensor(out, y)")
    # The explanation's picture puts the two ranks' differing calls side by side.
    svg = picture(finding)
    assert "rank 0" in svg and "rank 1" in svg and "collective calls differ" in svg
    assert "all_reduce" in svg.replace("-", "_") and "all_gather" in svg.replace("-", "_"), svg
    # No real-numbers run: ranks that disagree on their collectives would wait for each other forever.
    assert finding.witness == {
        "status": "not-run",
        "reason": "the ranks make different collective calls, so a run with real numbers would hang",
    }


def test_exception_in_the_builder_is_reported_at_its_line(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "builder-raises", sandbox).results
    assert outcome.verdict == "error"
    assert "ValueError: cannot place shard 1" in outcome.error["message"]
    assert outcome.error["site"]["line"] == line_of(tiny_root / "tinymlp/parallel.py", "raise ValueError")


def test_untraceable_model_is_reported_at_the_data_dependent_line(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "untraceable", sandbox).results
    assert outcome.verdict == "error"
    assert "tracing rank 0" in outcome.error["message"]
    assert outcome.error["site"]["line"] == line_of(tiny_root / "tinymlp/parallel.py", "if x.sum() > 0:")


def test_syntax_error_in_user_module_is_reported_at_its_line(tiny, sandbox, tiny_root) -> None:
    result = run(tiny, "syntax-error", sandbox)
    assert result.verdict == "error"
    assert "SyntaxError" in result.error["message"]
    assert result.error["site"]["file"] == str(tiny_root / "tinymlp/broken.py")
    assert result.error["site"]["line"] == 4


def test_missing_function_is_reported_at_the_declaration(tiny, sandbox, tiny_root) -> None:
    result = run(tiny, "missing-function", sandbox)
    assert result.verdict == "error"
    assert "has no 'does_not_exist'" in result.error["message"]
    assert result.error["site"]["line"] == line_of(tiny_root / "pyproject.toml", "tinymlp.model:does_not_exist")


@pytest.mark.parametrize("name", ["reduce-scatter", "broadcast", "all-to-all"])
def test_every_collective_kind_is_verified(tiny, sandbox, name) -> None:
    result = run(tiny, name, sandbox)
    assert {r.verdict for r in result.results} == {"verified"}


def test_collectives_are_captured_as_nodes_with_group_and_site(tiny, tiny_root) -> None:
    from shardproof.capture.program import CheckCapture

    kinds: dict[str, list[str]] = {}
    for name in ("reduce-scatter", "broadcast", "all-to-all"):
        captured = CheckCapture(tiny.check(name), tiny).capture(2)
        graph = captured.ranks[1].graph
        collectives = [n for n in graph.nodes if n.collective is not None]
        kinds[name] = [n.collective.kind for n in collectives]
        for node in collectives:
            assert node.collective.group == (0, 1)
            assert node.site.innermost.file == str(tiny_root / "tinymlp/collectives.py")
    assert kinds == {
        "reduce-scatter": ["reduce_scatter", "all_gather"],
        "broadcast": ["broadcast"],
        "all-to-all": ["all_to_all", "all_gather"],
    }


def test_a_rank_that_fails_with_real_numbers_where_the_reference_runs_is_a_shown_discrepancy(
    tiny, sandbox, tiny_root
) -> None:
    """The unmasked vocabulary-parallel lookup captures fine on meta tensors, but with real token
    ids the other ranks' ids index past the rank's table: a rank fails where the reference runs."""
    (outcome,) = run(tiny, "unmasked-embedding", sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    witness = outcome.discrepancies[0].witness
    assert witness["status"] == "confirmed" and witness["dtype"] == "float64", witness
    assert "IndexError: index out of range" in witness["failure"], witness
    assert "fails in float32 too" in witness["notes"][0]
    assert outcome.discrepancies[0].primary.line == line_of(tiny_root / "tinymlp/parallel.py", "F.embedding(ids")


def test_correct_code_the_rules_cannot_prove_is_unproven_never_a_discrepancy(tiny, sandbox, tiny_root) -> None:
    (outcome,) = run(tiny, "gathered-sum", sandbox).results
    assert outcome.verdict == "unproven" and not outcome.discrepancies, outcome.summary
    (finding,) = outcome.unproven
    assert finding.message.startswith("not proven: the reference's add")
    assert "the numbers agree on" in finding.message
    assert finding.primary.line == line_of(
        tiny_root / "tinymlp/parallel.py", "partial = F.linear(self.hidden(x), self.down_w)"
    )
    assert finding.details["suspected"] and finding.witness["status"] == "agree"


def test_a_bias_added_once_on_one_rank_before_the_all_reduce_is_verified(tiny, sandbox) -> None:
    """vLLM's RowParallelLinear adds the bias on rank 0 only: the partial sums tile the reduction and
    exactly one of them carries the bias (rules partial-plus-term, term-cover-*)."""
    result = run(tiny, "bias-on-first-rank", sandbox)
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]


@pytest.mark.parametrize("spelling", ["matmul-transpose", "at-t", "einsum"])
def test_a_linear_spelled_as_a_matmul_by_the_transposed_weight_is_verified(spelling: str, tiny, sandbox) -> None:
    """DeepSpeed writes every linear as `torch.matmul(x, W.transpose(-1, -2))`; others `x @ W.t()` or an
    einsum: the same linear map (rule matmul-by-transpose-is-linear)."""
    result = run(tiny, f"spelled-{spelling}", sandbox)
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]


def test_layer_norm_on_a_sequence_shard_is_verified_through_torchs_decomposition(tiny, sandbox) -> None:
    """nn.LayerNorm has no lowering of ours: it is written out as torch decomposes it (mean, variance,
    rsqrt), whose rules keep a selection of another dim (the standard SequenceParallel pattern)."""
    result = run(tiny, "sequence-parallel-layernorm", sandbox)
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]


def test_a_vocabulary_parallel_softmax_from_a_max_and_a_sum_all_reduce_is_verified(tiny, sandbox) -> None:
    """softmax is written out as torch decomposes it; over a sharded class dim its max and its sum are
    partial maxima and partial sums that the MAX and SUM all-reduces complete."""
    result = run(tiny, "vocab-parallel-softmax", sandbox)
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]
