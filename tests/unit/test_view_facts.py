"""Dim correspondences of reshapes, as the movement rules see them."""

from shardproof.localize.diagnose import blocked_tiling
from shardproof.verify.layout_facts import expand_facts, view_facts


def relations(facts: list[str]) -> set[str]:
    """The facts without the view's shape outside the related dims and the source's shape (their
    last two words)."""
    return {fact.rsplit(" ", 2)[0] + ")" for fact in facts}


def outside(fact: str) -> str:
    """A fact's view shape outside the dims it relates (the word before the source's shape)."""
    return fact.rsplit(" ", 2)[1]


def test_split_heads() -> None:
    assert set(view_facts("$v", (2, 16, 192), (2, 16, 12, 16))) == {
        '(vkeep $v -3 -4 "*,16,192->*,16,12,16" "2,16,192")',
        '(vkeep $v -2 -3 "2,*,192->2,*,12,16" "2,16,192")',
        '(vsplit $v -1 -2 16 "2,16,*->2,16,*,*" "2,16,192")',
    }


def test_merge_heads() -> None:
    assert "(vmerge $v -2 -1 16)" in relations(view_facts("$v", (2, 16, 8, 16), (2, 16, 128)))


def test_views_flattening_other_dims_differently_do_not_match() -> None:
    # Both keep the last dim of a [2, 16, 8] value, but only a view with the same shape outside
    # that dim may carry a selection over: [32, 8] and [2, 16, 1, 8] are not selections of each other.
    flat = [f for f in view_facts("$v", (2, 16, 8), (32, 8)) if f.startswith("(vkeep $v -1 -1 ")]
    heads = [f for f in view_facts("$v", (2, 16, 8), (2, 16, 1, 8)) if f.startswith("(vkeep $v -1 -1 ")]
    assert flat and heads and outside(flat[0]) != outside(heads[0])


def test_one_local_head_reads_as_a_split_with_unit_outer_dim() -> None:
    # A rank with a single local head reshapes [.., 16] -> [.., 1, 16]; it must line up with the
    # reference's [.., 192] -> [.., 12, 16].
    stated = view_facts("$v", (2, 16, 16), (2, 16, 1, 16))
    facts = relations(stated)
    assert "(vsplit $v -1 -2 16)" in facts
    rank_split = [f for f in stated if f.startswith("(vsplit $v -1 -2 16 ")]
    reference_split = [f for f in view_facts("$v", (2, 16, 192), (2, 16, 12, 16)) if f.startswith("(vsplit")]
    # the same shape outside the split dims: the rule applies
    assert [outside(f) for f in rank_split] == [outside(f) for f in reference_split]
    assert "(vkeep $v -1 -1)" in facts


def test_unit_dims_in_one_gap_may_keep_onto_each_other() -> None:
    facts = relations(view_facts("$v", (2, 16, 1, 16), (2, 16, 1, 1, 16)))
    assert {"(vkeep $v -2 -3)", "(vkeep $v -2 -2)"} <= facts


def test_a_fact_names_its_source_shape() -> None:
    # a view's class may hold views of sources of other shapes; each fact says which it is about
    assert all(f.endswith(' "2,16,192")') for f in view_facts("$v", (2, 16, 192), (2, 16, 12, 16)))
    assert view_facts("$v", (8, 16), (8, 1, 16))[0] == '(vunit $v -2 "8,16")'


def test_unrelated_group_gives_no_fact() -> None:
    assert view_facts("$v", (6, 4), (4, 6)) == []


def test_expand_keeps_only_dims_of_equal_size() -> None:
    # each names the expansion's shape without that dim: selections carry over between expansions
    # that expand every other dim alike
    assert expand_facts("$e", (2, 1, 16), (2, 4, 16)) == ['(emap $e -1 "2,4,_")', '(emap $e -3 "_,4,16")']


def test_blocked_tiling() -> None:
    assert blocked_tiling([(0, 4), (4, 8)], 8)
    assert blocked_tiling([(0, 16), (0, 16), (16, 32), (16, 32)])  # replicated blocks
    assert not blocked_tiling([(0, 16), (16, 32), (0, 16), (16, 32)])  # round-robin
    assert not blocked_tiling([(0, 4), (0, 4)], 8)  # every rank holds the first shard
    assert not blocked_tiling([(4, 8), (0, 4)])  # out of rank order
    assert not blocked_tiling([(0, 4), (4, 8)], 12)  # a gap at the end
