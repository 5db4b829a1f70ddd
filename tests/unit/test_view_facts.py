"""Dim correspondences of reshapes, as the movement rules see them."""

from shardproof.localize.diagnose import blocked_tiling
from shardproof.verify.encode import expand_facts, view_facts


def test_split_heads() -> None:
    assert set(view_facts("$v", (2, 16, 192), (2, 16, 12, 16))) == {
        "(vkeep $v -3 -4)",
        "(vkeep $v -2 -3)",
        "(vsplit $v -1 -2 16)",
    }


def test_merge_heads() -> None:
    assert "(vmerge $v -2 -1 16)" in view_facts("$v", (2, 16, 8, 16), (2, 16, 128))


def test_one_local_head_reads_as_a_split_with_unit_outer_dim() -> None:
    # A rank with a single local head reshapes [.., 16] -> [.., 1, 16]; it must line up with the
    # reference's [.., 192] -> [.., 12, 16].
    facts = set(view_facts("$v", (2, 16, 16), (2, 16, 1, 16)))
    assert "(vsplit $v -1 -2 16)" in facts
    assert "(vkeep $v -1 -1)" in facts


def test_unit_dims_in_one_gap_may_keep_onto_each_other() -> None:
    facts = set(view_facts("$v", (2, 16, 1, 16), (2, 16, 1, 1, 16)))
    assert {"(vkeep $v -2 -3)", "(vkeep $v -2 -2)"} <= facts


def test_unrelated_group_gives_no_fact() -> None:
    assert view_facts("$v", (6, 4), (4, 6)) == []


def test_expand_keeps_only_dims_of_equal_size() -> None:
    assert expand_facts("$e", (2, 1, 16), (2, 4, 16)) == ["(emap $e -1)", "(emap $e -3)"]


def test_blocked_tiling() -> None:
    assert blocked_tiling([(0, 4), (4, 8)], 8)
    assert blocked_tiling([(0, 16), (0, 16), (16, 32), (16, 32)])  # replicated blocks
    assert not blocked_tiling([(0, 16), (16, 32), (0, 16), (16, 32)])  # round-robin
    assert not blocked_tiling([(0, 4), (0, 4)], 8)  # every rank holds the first shard
    assert not blocked_tiling([(4, 8), (0, 4)])  # out of rank order
    assert not blocked_tiling([(0, 4), (4, 8)], 12)  # a gap at the end
