"""The all-reduce coverage detector says why partial sums do not tile a reduction, and says
nothing when they do (a report must not contradict the ranges it prints)."""

from __future__ import annotations

from shardproof.localize.detectors.reduction_coverage import tiling_problem


def test_ranges_that_tile_are_no_finding_in_any_order() -> None:
    assert tiling_problem({0: (0, 32), 1: (32, 64)}, 64) is None
    assert tiling_problem({0: (32, 64), 1: (0, 32)}, 64) is None  # rank order is not index order


def test_an_overlap_names_both_ranks_and_the_indices_summed_twice() -> None:
    assert tiling_problem({0: (0, 32), 1: (0, 32)}, 64) == "rank 0 and rank 1 both sum [0:32]"
    assert tiling_problem({0: (0, 40), 1: (32, 64)}, 64) == "rank 0 and rank 1 both sum [32:40]"


def test_a_gap_names_the_indices_no_rank_sums() -> None:
    assert tiling_problem({0: (0, 16), 1: (32, 64)}, 64) == "no rank sums [16:32]"
    assert tiling_problem({0: (0, 16), 1: (16, 32)}, 64) == "no rank sums [32:64]"
    assert tiling_problem({0: (8, 64)}, 64) == "no rank sums [0:8]"


def test_the_ranks_whose_parts_tile_the_reduction_are_found_nearest_first() -> None:
    from shardproof.localize.detectors.reduction_coverage import _tiling_partners

    two_by_two = {0: (0, 16), 1: (16, 32), 2: (0, 16), 3: (16, 32)}  # tensor-parallel pairs (0, 1), (2, 3)
    assert _tiling_partners(two_by_two, 0, 2, 32) == [0, 1]
    assert _tiling_partners(two_by_two, 3, 2, 32) == [2, 3]
    assert _tiling_partners({0: (0, 16), 1: (0, 16)}, 0, 2, 32) is None  # nobody holds [16:32]
