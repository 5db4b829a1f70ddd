"""duplicate-reduction: an all-reduce (sum) of a value every rank already holds in full multiplies
it by the group size; it is reported at that all-reduce. An all-reduce of partial sums, one
whose result is the reference's, or one that is no sum, is not this mistake."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.localize.detectors.duplicate_reduction import duplicate_reduction

SHAPE = (2, 8, 16)


def _kit(
    *, complete: bool = True, op: str = "sum", group: tuple[int, ...] = (), result_related: bool = False, ranks: int = 2
) -> Kit:
    """Every rank computes the reference's `h = up(x)` (line 40: whole when `complete`, else its
    partial sum) and all-reduces it at line 41."""
    kit = Kit(ranks)
    kit.input("x", *SHAPE)
    kit.ref.op("h", "linear", "x", out=SHAPE, line=10, module="mlp.up")
    kit.ref.op("y", "unary", "h", out=SHAPE, line=11, fn="relu")
    kit.ref.output("y")
    for r, rank in kit.each_rank():
        rank.op("h", "linear", "x", out=SHAPE, line=40, module="mlp.up")
        rank.all_reduce("total", "h", out=SHAPE, line=41, op=op, group=group)
        rank.output("total")
        if complete:
            kit.equal("h", f"rank{r}/h")
        else:
            kit.psum("h", f"rank{r}/h", 16 // ranks * r, 16 // ranks * (r + 1), 16)
        if result_related:
            kit.equal("h", f"rank{r}/total")
    return kit


def test_an_all_reduce_of_a_complete_value_is_reported_at_the_all_reduce() -> None:
    found = duplicate_reduction(_kit().context())
    assert found is not None and found.kind == "duplicate-reduction"
    assert at(found) == (PARALLEL_FILE, 41)
    assert "already holds in full (the output of linear mlp.up)" in found.message
    assert "2x too large" in found.message and "the 2 identical copies" in found.found
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 10)
    assert [(s.file, s.line) for s in found.related] == [(PARALLEL_FILE, 40), (REFERENCE_FILE, 10)]
    assert found.reference_node == "h" and found.parallel_nodes == ["rank0/total"]


def test_the_factor_is_the_size_of_the_reducing_group() -> None:
    found = duplicate_reduction(_kit(ranks=4).context())
    assert found is not None and "4x too large" in found.message and found.ranks == [0, 1, 2, 3]


def test_an_all_reduce_of_partial_sums_is_right() -> None:
    assert duplicate_reduction(_kit(complete=False).context()) is None


def test_an_all_reduce_whose_result_is_the_references_is_right() -> None:
    assert duplicate_reduction(_kit(result_related=True).context()) is None


def test_an_average_a_max_or_a_group_of_one_does_not_multiply() -> None:
    assert duplicate_reduction(_kit(op="avg").context()) is None
    assert duplicate_reduction(_kit(op="max").context()) is None
    assert duplicate_reduction(_kit(group=(0,)).context()) is None


def test_an_all_reduce_where_another_rank_adds_something_else_is_not_a_duplicate() -> None:
    """Expert parallelism: rank 0's sum over its experts equals the reference's running sum after
    the same experts (a complete reference value), rank 1 adds the other experts' outputs."""
    kit = _kit()
    kit.facts.classes.pop("rank1/h")
    kit.cls("rank1/h")  # rank 1's value is another one
    assert duplicate_reduction(kit.context()) is None
