"""A unit's facts loaded as few egglog commands: shapes and stated equalities as relations.

egglog 13 spends about 80 us on every top-level command and over a millisecond on a `union`
(../shared/reference/egglog.md), and a unit states four shape facts per value (`nd` and one `sz`
per dim, Encoder.let) and hundreds of equalities: at 64 ranks, most of a template's time was its
loading. So the engine loads the shape of a value as one fact of a relation `shapeK` (K dims) and
a stated equality as a fact of `union-stated`; one rule per relation, in the `shapes` family
(saturated before every pass of the others, rules.py), turns them into the very facts and
unions the unit stated, at the start of the first pass, in one batch. Nothing else reads these
relations, so the e-graph every other rule sees is the one the commands describe.
"""

from __future__ import annotations

import re

MOST_DIMS = 6  # values of more dims keep their `set` commands

_SET = re.compile(r"\(set \((nd|sz) (\$\S+)(?: (-?\d+))?\) (-?\d+)\)")


def declarations() -> str:
    """The relations and their rules (after the rulesets are declared: rules.program_text)."""
    lines = ["(relation union-stated (T T))"]
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
    Encoder.let states them) one `shapeK` fact, and every top-level union a `union-stated` fact."""
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
