"""Laws of opaque calls derived from DTensor's sharding strategies (verify/op_laws.py): what is
derived, that each law is checked on concrete tensors before a rule states it, and that a law
stated wrongly is caught by that check."""

from __future__ import annotations

import pytest
import torch

from shardproof.graph.model import TensorMeta
from shardproof.verify.law_check import check_law
from shardproof.verify.op_laws import Call, Law, Placement, resolve_op, strategy_laws

R, P = Placement("R"), Placement("P")


def S(dim: int) -> Placement:  # reads as DTensor's Shard(dim)
    return Placement("S", dim)


def _index_rows() -> Call:
    """x[idx] for x of (32, 64) and a vector of 32 row indices (MoE token gathering)."""
    metas = (TensorMeta((32, 64), "float32"), TensorMeta((32,), "int64"))
    return Call(torch.ops.aten.index.Tensor, ("<tensor>", ["<tensor>"]), (), metas, TensorMeta((32, 64), "float32"))


def _grouped_mm() -> Call | None:
    pytest.importorskip("transformers.integrations.moe")
    op = resolve_op("transformers::grouped_mm_fallback")
    if op is None:
        return None
    # dims of 64: DTensor's grouped-mm strategy needs 16-byte aligned shards
    metas = (TensorMeta((12, 64), "float32"), TensorMeta((4, 64, 64), "float32"), TensorMeta((4,), "int32"))
    return Call(op, ("<tensor>", "<tensor>", "<tensor>"), (), metas, TensorMeta((12, 64), "float32"))


def test_an_index_lookup_passes_partial_sums_and_selections_on() -> None:
    call = _index_rows()
    laws = set(strategy_laws(call))
    target = "aten::index.Tensor"
    assert Law(target, (P, R), P) in laws  # gathering rows is linear in the gathered value
    assert Law(target, (S(-1), R), S(-1)) in laws  # columns of x are columns of x[idx]
    assert Law(target, (R, S(-1)), S(-2)) in laws  # a block of indices gathers a block of rows
    for law in laws & {Law(target, (P, R), P), Law(target, (S(-1), R), S(-1)), Law(target, (R, S(-1)), S(-2))}:
        assert check_law(call, law) is None, law


def test_a_library_op_gets_the_laws_of_the_aten_op_it_computes() -> None:
    """transformers' grouped-matmul loop is asked as torch._grouped_mm, and checked as itself."""
    call = _grouped_mm()
    if call is None:
        pytest.skip("transformers has no grouped_mm_fallback")
    laws = set(strategy_laws(call))
    target = "transformers::grouped_mm_fallback"
    column = Law(target, (R, S(-1), R), S(-1))
    contraction = Law(target, (S(-1), S(-2), R), P)
    assert {column, contraction} <= laws
    assert check_law(call, column) is None
    assert check_law(call, contraction) is None


@pytest.mark.parametrize(
    "wrong",
    [
        Law("aten::index.Tensor", (S(-1), R), S(-2)),  # the wrong output dim
        Law("aten::index.Tensor", (R, S(-1)), P),  # a block of rows is not a partial sum
        Law("aten::index.Tensor", (S(-2), R), S(-2)),  # rows of x are not rows of x[idx]
    ],
)
def test_a_wrong_law_fails_its_concrete_check(wrong: Law) -> None:
    assert check_law(_index_rows(), wrong) is not None


def test_a_wrong_contraction_fails_its_concrete_check() -> None:
    call = _grouped_mm()
    if call is None:
        pytest.skip("transformers has no grouped_mm_fallback")
    # the contracted dim of the input with the output dim of the weight: not a partial sum
    assert check_law(call, Law(call.op.name(), (S(-1), S(-1), R), P)) is not None


def test_a_law_rule_names_its_operands_ranks_and_sizes() -> None:
    law = Law("aten::index.Tensor", (R, S(-1)), S(-2))
    text = law.rule('"aten::index.Tensor#0"', '"[]"', (2, 1, 2))
    assert "(= 2 (nd X0))" in text and "(= 1 (nd X1))" in text and "(= 2 (nd Y))" in text
    assert "(sel X1 x1 -1 R)" in text and "(= K (sz X1 -1))" in text and "(= K (sz Y -2))" in text
    assert ":ruleset derived" in text and text.count("(Op2 ") == 2


def test_a_law_is_checked_on_every_dtype_its_symbol_is_called_with() -> None:
    """Calls of one target and literal arguments share a rule whatever their dtypes: a law found on
    a float call is checked on an integer call too (integer sums are exact), and a partial sum of
    booleans (no sum at all) fails its check instead of crashing it."""
    ints = (TensorMeta((8, 4), "int64"), TensorMeta((8,), "int64"))
    call = Call(torch.ops.aten.index.Tensor, ("<tensor>", ["<tensor>"]), (), ints, TensorMeta((8, 4), "int64"))
    assert check_law(call, Law("aten::index.Tensor", (P, R), P)) is None
    bools = (TensorMeta((8, 4), "bool"), TensorMeta((8,), "int64"))
    call = Call(torch.ops.aten.index.Tensor, ("<tensor>", ["<tensor>"]), (), bools, TensorMeta((8, 4), "bool"))
    problem = check_law(call, Law("aten::index.Tensor", (P, R), P))
    assert problem is not None and "booleans" in problem
