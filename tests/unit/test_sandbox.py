"""Saturations run in a child process: running out of memory ends the child, not the caller."""

import json

from shardproof.verify.sandbox import Job, Sandbox

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


def test_independent_units_are_saturated_at_once_in_the_order_given() -> None:
    import time

    units = [[*TINY, f'(let $y{i} (Leaf "y{i}"))', f'(node $y{i} "unit{i}/y")'] for i in range(5)]
    with Sandbox(4096, workers=2) as box:
        start = time.perf_counter()
        results = box.saturate_all([Job(commands, 5, 30, 10_000) for commands in units])
        assert time.perf_counter() - start < 60
        assert [r.status for r in results] == ["fixpoint"] * 5
        assert len(box._children) == 2  # two children served five units
        for i, result in enumerate(results):
            assert result.facts is not None
            assert f"unit{i}/y" in json.dumps(result.to_dict()), "a result must be its own unit's"


def test_a_unit_that_crashes_its_child_leaves_the_others_their_results() -> None:
    with Sandbox(4096, workers=2) as box:
        results = box.saturate_all([Job(TINY, 5, 30, 10_000), Job(["(this is not egglog"], 5, 30, 10_000)])
        assert results[0].status == "fixpoint"
        assert results[1].facts is None


def test_started_children_serve_units_one_after_another_from_prepared_egraphs() -> None:
    # started ahead of the first unit, each child answers unit after unit, each from a fresh
    # e-graph it prepared while waiting: no unit sees another's terms
    units = [[*TINY, f'(let $y{i} (Leaf "y{i}"))', f'(node $y{i} "unit{i}/y")'] for i in range(4)]
    with Sandbox(4096, workers=2).start() as box:
        started = [child.process.pid for child in box._children]
        assert len(started) == 2 and all(child.alive() for child in box._children)
        results = [box.saturate(commands, 5, 30, 10_000) for commands in units]
        assert sorted(child.process.pid for child in box._children) == sorted(started)  # none spawned
    for i, result in enumerate(results):
        assert result.status == "fixpoint"
        text = json.dumps(result.to_dict())
        assert f"unit{i}/y" in text
        assert not any(f"unit{j}/y" in text for j in range(4) if j != i)


def test_a_child_returns_to_its_prepared_egraph_after_each_unit_even_one_egglog_rejects() -> None:
    # each unit starts from the e-graph as it was before the previous one (saved, then restored):
    # neither a unit's terms nor a half-loaded unit that egglog rejected reach the next one
    first = [*TINY, '(let $a (Leaf "a"))', '(node $a "first/a")']
    rejected = [*TINY, '(let $b (Leaf "b"))', '(node $b "rejected/b")', "(this is not egglog"]
    last = [*TINY, '(let $c (Leaf "c"))', '(node $c "last/c")']
    with Sandbox(4096, workers=1).start() as box:
        started = [child.process.pid for child in box._children]
        results = [box.saturate(commands, 5, 30, 10_000) for commands in (first, rejected, last)]
        assert [child.process.pid for child in box._children] == started  # one child served all three
    assert results[0].status == "fixpoint" and results[2].status == "fixpoint"
    assert results[1].facts is None and results[1].status == "egglog-error"
    text = json.dumps(results[2].to_dict())
    assert "last/c" in text
    assert "first/a" not in text and "rejected/b" not in text
