"""Saturations run in a child process: running out of memory ends the child, not the caller."""

from shardproof.verify.sandbox import Sandbox

TINY = ['(let $x (Leaf "x"))']


def test_saturation_runs_in_the_child() -> None:
    with Sandbox(4096) as box:
        result = box.saturate(TINY, 5, 30, 10_000)
        assert result.status == "fixpoint"
        assert result.facts is not None


def test_out_of_memory_is_a_result_not_a_crash() -> None:
    with Sandbox(64) as box:  # too small to even import egglog
        result = box.saturate(TINY, 5, 30, 10_000)
        assert result.status == "memory-limit"
        assert "64 MiB memory limit" in result.message
        assert result.facts is None
