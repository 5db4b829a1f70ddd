"""A rank computing on a permuted layout (sequence first against a batch-first reference): its
values hold permutations of related values, which the localizer reads as relations of their own
(so the first broken value is where the layout breaks, not where it begins), and which never make
an output count as the reference's."""

from __future__ import annotations

from evidence_kit import Kit

from shardproof.verify.verdict import output_relations


def _transposed_partial_sums(kit: Kit) -> None:
    """y = linear(x, w) in the reference; rank r computes sequence first: t = linear(x.transpose(0,
    1), w_r), the transpose of its partial sum of y, a term no program names (`unnamed/p{r}`)."""
    kit.input("x", 2, 8, 16)
    kit.ref.op("y", "linear", "x", "w", out=(2, 8, 16), line=10, module="down")
    kit.ref.output("y")
    for r, rank in kit.each_rank():
        rank.op("xt", "permute", "x", out=(8, 2, 16), line=40, perm=[1, 0, 2])
        rank.op("t", "linear", "xt", "w", out=(8, 2, 16), line=41)
        rank.output("t")
        kit.permute(f"rank{r}/xt", "x", "1,0,2")
        kit.psum("y", f"unnamed/p{r}", 16 * r, 16 * r + 16, 32)
        kit.permute(f"rank{r}/t", f"unnamed/p{r}", "1,0,2")


def test_a_permuted_partial_sum_is_a_partial_sum_with_its_permutation() -> None:
    kit = Kit()
    _transposed_partial_sums(kit)
    index = kit.context().index
    [(relation, values)] = index.relations("y", 0)
    assert values == ["t"]
    assert (relation.kind, relation.start, relation.end, relation.perm) == ("psum", 0, 16, "1,0,2")
    described = "a partial sum over [0:16] of the 32 reduced indices, with its dims in the order (1, 0, 2)"
    assert relation.describe() == described
    [(back, refs)] = [(rel, refs) for rel, refs in index.relations_of_rank_value(1, "t")]
    assert (back.kind, back.start, back.perm, refs) == ("psum", 16, "1,0,2", ["y"])


def test_a_permuted_copy_is_its_own_kind_and_a_plain_relation_hides_it() -> None:
    kit = Kit()
    _transposed_partial_sums(kit)
    index = kit.context().index
    # the rank's own input is the reference's: that is its relation, its transpose is not listed
    assert [(rel.kind, values) for rel, values in index.relations("x", 0)] == [("equal", ["x"])]
    [(relation, refs)] = index.relations_of_rank_value(0, "xt")
    assert (relation.kind, relation.inner, relation.perm, refs) == ("permuted", "equal", "1,0,2", ["x"])
    assert relation.describe() == "the full value (replicated), with its dims in the order (1, 0, 2)"


def test_an_output_is_never_the_reference_s_through_a_permutation() -> None:
    kit = Kit()
    _transposed_partial_sums(kit)
    ctx = kit.context()
    ranks = [p.graph for p in kit.ranks]
    found, failing = output_relations(ctx.index, kit.ref.graph, ranks, "partial")
    assert failing == [0] and found[0].relation == "none"
