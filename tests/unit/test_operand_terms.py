"""An opaque call of more than four operands is written as a term of four, its operands after the
third as one list: equal operands give equal terms (congruence relates such calls across
programs, as it does those of four), and operands in another order or of another value do not."""

from shardproof.verify.opaque_calls import OPERAND_LIST, operand_terms


def test_four_operands_or_fewer_are_kept_as_they_are() -> None:
    assert operand_terms(["a"]) == ["a"]
    assert operand_terms(["a", "b", "c", "d"]) == ["a", "b", "c", "d"]


def test_more_operands_keep_the_first_three_and_list_the_rest_in_order() -> None:
    terms = operand_terms(["a", "b", "c", "d", "e", "f"])
    assert terms == ["a", "b", "c", f'(Op2 {OPERAND_LIST} d (Op2 {OPERAND_LIST} e f "") "")']
    assert terms == operand_terms(["a", "b", "c", "d", "e", "f"])
    assert terms != operand_terms(["a", "b", "c", "d", "f", "e"])
    assert terms != operand_terms(["a", "b", "c", "d", "e", "g"])
    assert operand_terms(["a", "b", "c", "d", "e"])[-1] != operand_terms(["a", "b", "c", "d", "e", "f"])[-1]
