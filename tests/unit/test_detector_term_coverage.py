"""wrong-shard of a sum split over ranks by its terms (experts without all-to-all): each rank adds
its own experts' outputs and one all-reduce adds the ranks' sums. Terms the ranks add twice or
never are reported at the all-reduce, with every rank's terms; ranks that add every term of the
reference's sum exactly once, a term that is none of the reference's, or a reduction over one
rank, are no finding."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.localize.detectors.term_coverage import term_coverage

SHAPE = (2, 8, 16)
EXPERTS = 4
REDUCE = 45


def _kit(
    experts: dict[int, list[int]], *, group: tuple[int, ...] = (0, 1), foreign: bool = False, reducing: int = 2
) -> Kit:
    """The reference adds its 4 experts' outputs one by one to zeros (line 12). Rank r computes
    the experts `experts[r]` (line 40), adds them to zeros (line 42) and all-reduces the sum over
    `group` (line 45) if it is one of the first `reducing` ranks; with `foreign`, rank 1's first
    term is no expert output of the reference."""
    kit = Kit()
    kit.input("x", *SHAPE)
    ref = kit.ref
    ref.op("zeros", "constant", out=SHAPE, line=11, zero=True)
    total = "zeros"
    for e in range(EXPERTS):
        ref.op(f"e{e}", "linear", "x", out=SHAPE, line=10, module=f"experts.{e}")
        ref.op(f"sum{e}", "binary", total, f"e{e}", out=SHAPE, line=12, fn="add")
        total = f"sum{e}"
    ref.output(total)
    for r, rank in kit.each_rank():
        rank.op("zeros", "constant", out=SHAPE, line=41, zero=True)
        total = "zeros"
        for i, e in enumerate(experts[r]):
            rank.op(f"e{i}", "linear", "x", out=SHAPE, line=40, module=f"experts.{e}")
            rank.op(f"sum{i}", "binary", total, f"e{i}", out=SHAPE, line=42, fn="add")
            total = f"sum{i}"
            if foreign and r == 1 and i == 0:
                kit.cls(f"rank{r}/e{i}")
            else:
                kit.equal(f"e{e}", f"rank{r}/e{i}")
        if r < reducing:
            rank.all_reduce("total", total, out=SHAPE, line=REDUCE, group=group)
            total = "total"
        rank.output(total)
    return kit


def test_an_expert_added_on_two_ranks_and_one_on_none_are_reported_at_the_all_reduce() -> None:
    found = term_coverage(_kit({0: [0, 1], 1: [1, 2]}).context(), [0])
    assert found is not None and found.kind == "wrong-shard"
    assert at(found) == (PARALLEL_FILE, REDUCE)
    assert "the reference's sum of 4 terms" in found.message
    assert found.found == "term 1 is added on ranks 0, 1; term 3 on no rank (rank 0: 0, 1, rank 1: 1, 2)"
    assert found.expected == "each of the 4 terms added on exactly one rank"
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 12)
    assert found.ranks == [0, 1] and found.parallel_nodes == ["rank0/total", "rank1/total"]


def test_terms_two_ranks_add_are_named_with_both_ranks() -> None:
    found = term_coverage(_kit({0: [0, 1, 2, 3], 1: [0, 1]}).context(), [0])
    assert found is not None
    assert found.found == "terms 0, 1 are added on ranks 0, 1 (rank 0: 0, 1, 2, 3, rank 1: 0, 1)"


def test_every_term_on_exactly_one_rank_is_right() -> None:
    assert term_coverage(_kit({0: [0, 1], 1: [2, 3]}).context(), [0]) is None
    assert term_coverage(_kit({0: [3, 0], 1: [2, 1]}).context(), [0]) is None  # any assignment, any order


def test_a_term_the_reference_does_not_add_is_not_this_mistake() -> None:
    assert term_coverage(_kit({0: [0, 1], 1: [1, 2]}, foreign=True).context(), [0]) is None


def test_a_reduction_over_one_rank_adds_no_ranks_sums() -> None:
    assert term_coverage(_kit({0: [0, 1], 1: [1, 2]}, group=(0,)).context(), [0]) is None


def test_an_all_reduce_only_one_rank_makes_pairs_with_nothing() -> None:
    # rank 1 returns its own sum: the collectives do not pair (another detector's finding)
    assert term_coverage(_kit({0: [0, 1], 1: [2, 3]}, reducing=1).context(), [0]) is None


def test_the_same_terms_on_every_rank_are_a_duplicate_reduction_not_a_split_sum() -> None:
    assert term_coverage(_kit({0: [1], 1: [1]}).context(), [0]) is None
