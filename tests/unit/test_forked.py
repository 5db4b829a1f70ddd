"""Ranks captured in forked processes come back as if captured one after another here."""

from __future__ import annotations

import os

import pytest

from shardproof.capture.forked import map_ranks


def _slowly(rank: int) -> tuple[int, int]:
    import time

    time.sleep(0.2)  # long enough for every process to take ranks
    return rank, os.getpid()


def test_ranks_come_back_in_order_from_every_process() -> None:
    results = map_ranks(_slowly, 5, 2)
    assert [rank for rank, _ in results] == [0, 1, 2, 3, 4]
    assert len({pid for _, pid in results}) == 2
    assert results[0][1] == os.getpid()  # rank 0 is always this process's


def test_work_this_process_does_first_leaves_the_ranks_to_the_others() -> None:
    import time

    done: list[float] = []
    start = time.perf_counter()
    results = map_ranks(_slowly, 5, 2, before_own=lambda: (time.sleep(0.9), done.append(time.perf_counter())))
    assert [rank for rank, _ in results] == [0, 1, 2, 3, 4]
    # while this process was busy, the child took ranks 1 to 4 (0.2 s each)
    assert [rank for rank, pid in results if pid == os.getpid()] == [0]
    assert done and time.perf_counter() - start < 0.9 + 5 * 0.2


def test_the_first_error_in_rank_order_is_raised_whoever_met_it() -> None:
    def capture(rank: int) -> int:
        if rank in (1, 2):  # rank 1 fails in the child, rank 2 here
            raise ValueError(f"rank {rank} cannot be built")
        return rank

    with pytest.raises(ValueError, match="rank 1 cannot be built"):
        map_ranks(capture, 4, 2)


def test_a_rank_a_child_cannot_send_back_is_captured_here() -> None:
    parent = os.getpid()

    def capture(rank: int) -> object:
        if os.getpid() != parent:
            return lambda: rank  # does not pickle
        return rank

    assert map_ranks(capture, 3, 2) == [0, 1, 2]


def test_a_child_that_dies_costs_only_time() -> None:
    parent = os.getpid()

    def capture(rank: int) -> int:
        if os.getpid() != parent:
            os._exit(3)
        return rank * 10

    assert map_ranks(capture, 4, 2) == [0, 10, 20, 30]


def test_what_rank_0_rules_out_stops_every_process_at_once() -> None:
    import time

    def capture(rank: int) -> int:
        if rank:
            time.sleep(30)  # the other process would take long
        return rank

    def check_first(result: int) -> None:
        raise LookupError(f"rank {result} rules it out")

    start = time.perf_counter()
    with pytest.raises(LookupError, match="rank 0 rules it out"):
        map_ranks(capture, 4, 2, check_first)
    assert time.perf_counter() - start < 10
    with pytest.raises(LookupError):
        map_ranks(capture, 1, 1, check_first)


_STATE: list[int] = []


def _changes_what_it_was_given(rank: int) -> tuple[int, bool, int]:
    from shardproof.capture.forked import in_own_fork

    _STATE.append(rank)  # a rank's builder changing the reference it received
    return rank, in_own_fork(), len(_STATE)


@pytest.mark.parametrize("workers", [1, 2])
def test_isolated_ranks_each_start_from_the_state_the_ranks_began_with(workers: int) -> None:
    learned: list[int] = []
    results = map_ranks(
        _changes_what_it_was_given, 4, workers, isolate=True, learn=lambda result: learned.append(result[0])
    )
    assert results == [(rank, True, 1) for rank in range(4)]  # no rank saw another's change
    assert _STATE == []  # nor did this process
    assert 0 in learned  # this process learned what its ranks' forks found


def test_an_isolated_rank_s_error_is_raised_here() -> None:
    def capture(rank: int) -> int:
        if rank == 2:
            raise ValueError(f"rank {rank} cannot be built")
        return rank

    with pytest.raises(ValueError, match="rank 2 cannot be built"):
        map_ranks(capture, 4, 1, isolate=True)
