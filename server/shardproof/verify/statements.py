"""A unit's facts loaded as few egglog commands: shapes and stated equalities as relations.

egglog 13 spends about 80 us on every top-level command and over a millisecond on a `union`
(../shared/reference/egglog.md), and a unit states four shape facts per value (`nd` and one `sz`
per dim, Encoder.let) and hundreds of equalities: at 64 ranks, most of a template's time was its
loading. So the engine loads the shape of a value as one fact of a relation `shapeK` (K dims) and
a stated equality as a fact of `union-stated`; one rule per relation, in the `shapes` family
(saturated before every pass of the others, rules.py), turns them into the very facts and
unions the unit stated, at the start of the first pass, in one batch. Nothing else reads these
relations, so the e-graph every other rule sees is the one the commands describe.

The unit's names are not egglog globals either: every global (`let`) makes every later command
of the e-graph slower in egglog 13.2 (measured: a `set` 22 us with no globals, ~100 us after
10 k of them; the TP=64 template unit of 25.6 k commands loaded in 1.44 s and saturated in 2.4 s,
in 0.86 s and 1.83 s with its names in one table). A name is a row of the function `named`
(String -> T), set once where the unit lets it and looked up where it reads it: the same term,
the same e-class, the same rules firing.
"""

from __future__ import annotations

import re

MOST_DIMS = 6  # values of more dims keep their `set` commands

_SET = re.compile(r"\(set \((nd|sz) (\$\S+)(?: (-?\d+))?\) (-?\d+)\)")
# a string literal (kept as it is: a label may hold any character) or a unit's name
_NAME_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\$[^\s()"]+')
NAMES_TABLE = "named"  # bookkeeping, not a term: not counted as the e-graph's rows


def declarations() -> str:
    """The relations and their rules (after the rulesets are declared: rules.program_text)."""
    lines = [f"(function {NAMES_TABLE} (String) T :no-merge)", "(relation union-stated (T T))"]
    lines += [f"(relation shape{k} (T {' '.join(['i64'] * k)}))" for k in range(1, MOST_DIMS + 1)]
    lines.append('(rule ((union-stated a b)) ((union a b)) :ruleset shapes :name "a stated equality")')
    for k in range(1, MOST_DIMS + 1):
        sizes = [f"s{i}" for i in range(k)]
        actions = [f"(set (nd X) {k})"] + [f"(set (sz X {i - k}) {size})" for i, size in enumerate(sizes)]
        lines.append(
            f"(rule ((shape{k} X {' '.join(sizes)})) ({' '.join(actions)}) :ruleset shapes "
            f':name "the stated shape of a value of {k} dims")'
        )
    return "\n".join(lines)


def compact(commands: list[str]) -> list[str]:
    """`commands` with each value's run of shape facts (`nd`, then `sz` of every dim in order, as
    Encoder.let states them) one `shapeK` fact, every top-level union a `union-stated` fact, and
    every name a row of the names table."""
    return [_unnamed(command) for command in _grouped(commands)]


def _unnamed(command: str) -> str:
    """`command` with its `let` a row of the names table and every name it reads looked up there."""
    if command.startswith("(let $"):
        name, _, term = command[len("(let $") :].partition(" ")
        return f'(set ({NAMES_TABLE} "{name}") {_NAME_OR_STRING.sub(_lookup, term)}'
    return _NAME_OR_STRING.sub(_lookup, command)


def _lookup(match: re.Match[str]) -> str:
    token = match.group(0)
    return token if token.startswith('"') else f'({NAMES_TABLE} "{token[1:]}")'


def _grouped(commands: list[str]) -> list[str]:
    """`commands` with each value's shape facts one fact and every union a stated one."""
    out: list[str] = []
    i = 0
    n = len(commands)
    while i < n:
        command = commands[i]
        if command.startswith("(union "):
            out.append("(union-stated " + command[len("(union ") :])
            i += 1
            continue
        if command.startswith("(set (nd "):
            grouped = _shape(commands, i)
            if grouped is not None:
                fact, i = grouped
                out.append(fact)
                continue
        out.append(command)
        i += 1
    return out


def _shape(commands: list[str], start: int) -> tuple[str, int] | None:
    """The `shapeK` fact of the run of shape facts at `start`, and the index after it."""
    head = _SET.fullmatch(commands[start])
    if head is None or head.group(1) != "nd":
        return None
    name, dims = head.group(2), int(head.group(4))
    if not 1 <= dims <= MOST_DIMS or start + dims >= len(commands):
        return None
    sizes = []
    for offset in range(dims):
        match = _SET.fullmatch(commands[start + 1 + offset])
        if match is None or match.group(1) != "sz" or match.group(2) != name or int(match.group(3)) != offset - dims:
            return None
        sizes.append(match.group(4))
    return f"(shape{dims} {name} {' '.join(sizes)})", start + 1 + dims
