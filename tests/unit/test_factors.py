"""Constant factors carried outside linear operations in joint graphs (verify/encode.py): the
terms both programs write for the same multiple, the factor of each operation, and the facts
that let an expansion of one value to fewer rows be read as any window of the longer one."""

from __future__ import annotations

from fractions import Fraction

from shardproof.graph.model import Node, TensorMeta
from shardproof.verify.factored_terms import _linear_factor
from shardproof.verify.layout_facts import broadcast_facts, view_facts
from shardproof.verify.scalars import scaled_term


def _node(op: str, **attrs: object) -> Node:
    return Node("n", op, ("a", "b"), dict(attrs), TensorMeta((2,), "float32"))


def test_the_same_factor_is_written_the_same_way() -> None:
    assert scaled_term("$x", Fraction(1)) == "$x"
    assert scaled_term("$x", Fraction(1, 512)) == '(ScI "div" $x 512)'
    assert scaled_term("$x", Fraction(3, 2)) == '(ScI "mul" (ScI "div" $x 2) 3)'


def test_linear_operations_carry_their_inputs_factors() -> None:
    half, third = Fraction(1, 2), Fraction(1, 3)
    assert _linear_factor(_node("matmul"), [half, third]) == Fraction(1, 6)
    assert _linear_factor(_node("binary", fn="div"), [half, third]) == Fraction(3, 2)
    # a sum keeps the first operand's factor (the second is rescaled to it)
    assert _linear_factor(_node("binary", fn="add"), [half, third]) == half
    assert _linear_factor(_node("view", shape=[2]), [half, Fraction(1)]) == half


def test_nonlinear_operations_take_scaled_values_as_they_are() -> None:
    assert _linear_factor(_node("unary", fn="silu"), [Fraction(1, 2)]) is None
    assert _linear_factor(_node("scalar", fn="add", value=1), [Fraction(1, 2)]) is None
    # a mask or an index may not be scaled
    assert _linear_factor(_node("fill", value=0.0), [Fraction(1), Fraction(1, 2)]) is None


def test_broadcast_dims_are_keyed_by_the_rest_of_the_shape() -> None:
    # a backward seed expanded to a rank's 2 rows and to the reference's 4 differs only along dim 0
    rank, reference = broadcast_facts("y", (), (2, 8)), broadcast_facts("Y", (), (4, 8))
    assert '(ebk y -2 "_,8")' in rank and '(ebk Y -2 "_,8")' in reference
    assert broadcast_facts("y", (2, 8), (2, 8)) == []


def test_a_unit_dim_before_a_merge_is_its_outer_part() -> None:
    # one row of [4, 8, 32] flattened: the row's selection scales into the flat dim like the reference's
    assert '(vmerge y -3 -1 256 "*,*,*->*" "1,8,32")' in view_facts("y", (1, 8, 32), (256,))
    assert '(vsplit y -1 -3 256 "*->*,*,*" "256")' in view_facts("y", (256,), (1, 8, 32))
