"""Shapes and stated equalities loaded as relations (verify/statements.py): fewer commands, and the
same e-graph for every other rule, so the same relations are proven."""

from __future__ import annotations

import pytest

from shardproof.config import load_project
from shardproof.verify import rules, statements
from shardproof.verify.egglog_adapter import EGraph
from shardproof.verify.encode import encode_unit
from shardproof.verify.engine import read_facts
from shardproof.verify.language import DECLARATIONS


def test_a_values_shape_facts_are_one_fact_and_a_union_a_stated_one() -> None:
    commands = [
        '(let $x (Input "x"))',
        "(set (nd $x) 3)",
        "(set (sz $x -3) 2)",
        "(set (sz $x -2) 16)",
        "(set (sz $x -1) 64)",
        '(union $x (Const "c"))',
        "(set (nd $y) 2)",  # a run that is not the value's whole shape stays as it is
        "(set (sz $y -1) 4)",
    ]
    assert statements.compact(commands) == [
        '(set (named "x") (Input "x"))',
        '(shape3 (named "x") 2 16 64)',
        '(union-stated (named "x") (Const "c"))',
        '(set (nd (named "y")) 2)',
        '(set (sz (named "y") -1) 4)',
    ]


def test_names_are_rows_of_one_table_and_labels_stay_as_written() -> None:
    """egglog 13.2 makes every command slower with every global: a name is a row, not a `let`;
    a string literal is a label, whatever it holds."""
    commands = ['(let $a_1 (Input "$b (x)"))', '(let $c (Bin "add" $a_1 $a_1))', '(node $c "rank0/$a_1")']
    assert statements.compact(commands) == [
        '(set (named "a_1") (Input "$b (x)"))',
        '(set (named "c") (Bin "add" (named "a_1") (named "a_1")))',
        '(node (named "c") "rank0/$a_1")',
    ]


def _saturated(commands: list[str], compacted: bool):
    egraph = EGraph()
    egraph.run_text(DECLARATIONS)
    egraph.run_text(rules.program_text())
    egraph.run_text(statements.declarations())
    egraph.load(statements.compact(commands) if compacted else commands)
    while egraph.run_schedule(rules.schedule(8)).updated:
        pass
    return read_facts(egraph)


def _described(facts) -> tuple[frozenset, frozenset]:
    """The classes as sets of value labels, and the selections between labelled classes."""
    labels: dict[int, set[str]] = {}
    for label, cls in facts.classes.items():
        labels.setdefault(cls, set()).add(label)
    named = {cls: frozenset(values) for cls, values in labels.items()}
    selections = frozenset(
        (named[x], named[y], dim, tuple(ranges)) for x, y, dim, ranges in facts.sel if x in named and y in named
    )
    return frozenset(named.values()), selections


@pytest.mark.parametrize("check", ["ok", "all-to-all", "vocab-parallel-softmax", "bias-on-first-rank"])
def test_the_relations_proven_are_those_of_the_commands_as_stated(tiny_root, check: str) -> None:
    from shardproof.capture.program import CheckCapture

    project = load_project(tiny_root)
    captured = CheckCapture(project.check(check), project).capture(2)
    unit = encode_unit(
        captured.reference.graph, captured.reference.values, [(r.graph, r.values) for r in captured.ranks]
    )
    assert len(statements.compact(unit.commands)) < len(unit.commands)
    assert _described(_saturated(unit.commands, True)) == _described(_saturated(unit.commands, False))
