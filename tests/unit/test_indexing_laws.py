"""Laws of indexing along one dim (verify/indexing_laws.py): a write at positions of one dim
(`cache[:, :, pos] = v`, which DTensor has no strategy for) keeps a block of any other dim, each
law checked on concrete tensors; and a call in another form than the one a hand-written rule
matches still gets its laws (verify/opaque_rules.py opaque_forms)."""

from __future__ import annotations

import torch

from shardproof.graph.model import TensorMeta
from shardproof.verify.indexing_laws import indexing_laws
from shardproof.verify.law_check import check_law
from shardproof.verify.op_laws import Call, Law, Placement
from shardproof.verify.opaque_rules import opaque_forms

R = Placement("R")


def S(dim: int) -> Placement:  # reads as DTensor's Shard(dim)
    return Placement("S", dim)


def _cache_write(values_shape: tuple[int, ...]) -> Call:
    """cache[:, :, pos] = v for a cache of (2, 4, 8, 3) and 5 positions."""
    metas = (TensorMeta((2, 4, 8, 3), "float32"), TensorMeta((5,), "int64"), TensorMeta(values_shape, "float32"))
    args = ("<tensor>", [None, None, "<tensor>"], "<tensor>")
    return Call(torch.ops.aten.index_put.default, args, (), metas, TensorMeta((2, 4, 8, 3), "float32"))


def test_a_write_at_positions_keeps_the_blocks_of_every_other_dim() -> None:
    call = _cache_write((2, 4, 5, 3))
    laws = indexing_laws(call)
    target = "aten::index_put"
    assert set(laws) == {
        Law(target, (S(-4), R, S(-4)), S(-4)),
        Law(target, (S(-3), R, S(-3)), S(-3)),
        Law(target, (S(-1), R, S(-1)), S(-1)),
    }
    for law in laws:
        assert check_law(call, law) is None, law


def test_values_broadcast_along_a_dim_are_replicated_in_its_law() -> None:
    call = _cache_write((4, 1, 3))  # no batch dim, one position's values broadcast over the five
    laws = set(indexing_laws(call))
    assert Law("aten::index_put", (S(-4), R, R), S(-4)) in laws
    assert Law("aten::index_put", (S(-3), R, S(-3)), S(-3)) in laws
    for law in laws:
        assert check_law(call, law) is None, law


def test_a_block_of_the_written_dim_is_no_law() -> None:
    """The positions index the whole dim: a block of it is written at other positions."""
    call = _cache_write((2, 4, 5, 3))
    wrong = Law("aten::index_put", (S(-2), R, S(-2)), S(-2))
    assert wrong not in indexing_laws(call)
    assert check_law(call, wrong) is not None


def test_a_boolean_mask_or_two_index_tensors_give_no_law() -> None:
    metas = (TensorMeta((4, 6), "float32"), TensorMeta((6,), "bool"))
    mask = Call(torch.ops.aten.index.Tensor, ("<tensor>", [None, "<tensor>"]), (), metas, TensorMeta((4, 3), "float32"))
    assert indexing_laws(mask) == []
    metas = (TensorMeta((4, 6, 5), "float32"), TensorMeta((3,), "int64"), TensorMeta((3,), "int64"))
    two = Call(
        torch.ops.aten.index.Tensor, ("<tensor>", ["<tensor>", "<tensor>"]), (), metas, TensorMeta((3, 5), "float32")
    )
    assert indexing_laws(two) == []


def test_a_hand_written_rule_excludes_only_the_form_it_matches() -> None:
    forms = opaque_forms()
    one_dim = '"[\\"<tensor>\\", [\\"<tensor>\\"], \\"<tensor>\\"]"'
    assert forms["aten::index_put"] == frozenset({one_dim})
    assert forms["shardproof::convolution"] is None  # its rules take any literal arguments
