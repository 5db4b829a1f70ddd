"""Where a wrong constant was computed: the line to change when a scale or a divisor the built
module keeps (`self.scale = 1.0 / math.sqrt(self.q_size)`) differs from the reference's.

The constant's derivation is traced from the world size (capture/numbers.py). As for a cut
(number_origin.py), the question is which single computation, given another value, makes the
constant the reference's: the value each step would need is found by undoing the operations above
it (the constant is `1 / sqrt(q)`: q must be 1 / target²), and confirmed by recomputing the
constant from it. The earliest such step is the mistake.

One law keeps the answer where developers put the mistake: a per-rank share (`n // world_size`,
`n / world_size`) is right as a share. It may only be wrong in its rounding (another value within
one of n / world_size); a constant that needs the share to be a whole size needs the line that
uses the share changed, not the share. When only shares could change the constant, the answer is
the use (the caller reports where the constant is read).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.numbers import NumberStep
from .number_origin import Substitutions, _evaluate, share_of
from .plain_numbers import plain_operands

_TOLERANCE = 1e-9


def constant_origin(step: NumberStep, target: float) -> NumberStep | None:
    """The earliest computation in the constant's derivation whose changed value alone makes the
    constant `target` (None: no computation can, or only a per-rank share could)."""
    subs: Substitutions = {}
    steps = {id(s): s for s in step.ancestors()}
    for s in list(steps.values()):
        plain = plain_operands(s)
        if plain:
            subs[id(s)] = plain
            steps.update({id(p): p for p in plain.values()})
    parents = _parents(steps.values(), subs)
    candidates = sorted((s for s in steps.values() if not s.is_origin and s.frame is not None), key=lambda s: s.order)
    for candidate in candidates:
        needed = _needed(step, candidate, target, parents, subs)
        if needed is None or not _allowed(candidate, needed):
            continue
        recomputed = _evaluate(step, {id(candidate)}, np.asarray(float(needed)), {}, subs)
        if _close(float(np.asarray(recomputed)), target):
            return candidate
    return None


def _parents(steps: object, subs: Substitutions) -> dict[int, tuple[NumberStep, int]]:
    """For each step, the step that reads it and at which operand (one reader: a derivation is a
    tree along the path that matters; a step read twice is not inverted)."""
    readers: dict[int, list[tuple[NumberStep, int]]] = {}
    for s in steps:  # type: ignore[attr-defined]
        own = subs.get(id(s), {})
        for index, operand in enumerate(s.operands):
            source = own.get(index, operand)
            if isinstance(source, NumberStep):
                readers.setdefault(id(source), []).append((s, index))
    return {key: found[0] for key, found in readers.items() if len(found) == 1}


def _needed(
    root: NumberStep,
    candidate: NumberStep,
    target: float,
    parents: dict[int, tuple[NumberStep, int]],
    subs: Substitutions,
) -> float | None:
    """The value `candidate` must take for `root` to be `target`, undoing each operation on the
    way down (None when an operation cannot be undone)."""
    path: list[tuple[NumberStep, int]] = []
    current = candidate
    while current is not root:
        if id(current) not in parents:
            return None
        parent, index = parents[id(current)]
        path.append((parent, index))
        current = parent
    needed = target
    for parent, index in reversed(path):
        others = [
            float(_evaluate(subs.get(id(parent), {}).get(i, o), set(), np.asarray(0.0), {}, subs))
            if isinstance(subs.get(id(parent), {}).get(i, o), NumberStep)
            else float(o)
            for i, o in enumerate(parent.operands)
        ]
        undone = _undo(parent.op, index, needed, others)
        if undone is None:
            return None
        needed = undone
    return needed


def _undo(op: str, index: int, result: float, operands: list[float]) -> float | None:
    other = operands[1 - index] if len(operands) == 2 else None
    try:
        match op:
            case "+":
                return result - other  # type: ignore[operator]
            case "-":
                return result + other if index == 0 else other - result  # type: ignore[operator]
            case "*":
                return result / other if other else None  # type: ignore[operator]
            case "/":
                return result * other if index == 0 else (other / result if result else None)  # type: ignore[operator]
            case "//":
                # a whole quotient: the smallest divisor (or dividend) giving it
                if index == 0:
                    return result * other  # type: ignore[operator]
                return math.floor(other / result) if result else None  # type: ignore[operator]
            case "**":
                if index == 0 and other:
                    return result ** (1 / other) if result > 0 else None  # type: ignore[operator]
                return None
            case "sqrt":
                return result * result if result >= 0 else None
            case "neg":
                return -result
            case "pos" | "floor" | "ceil" | "round" | "trunc":
                return result
    except (ArithmeticError, ValueError, TypeError):
        return None
    return None


def _allowed(candidate: NumberStep, needed: float) -> bool:
    """A whole number stays whole; a per-rank share is only ever re-rounded."""
    if isinstance(candidate.value, int) and not _close(needed, round(needed)):
        return False
    share = share_of(candidate)
    return share is None or abs(needed - share) < 1


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=1e-12)


def widest_on_line(root: NumberStep, step: NumberStep) -> NumberStep:
    """The whole expression on `step`'s line that computes from it (`1.0 / math.sqrt(q)` rather
    than `math.sqrt(q)`)."""
    if step.frame is None:
        return step
    line = (step.frame.file, step.frame.line)
    best = step
    for s in root.ancestors():
        on_line = s.frame is not None and (s.frame.file, s.frame.line) == line
        if on_line and s.order > best.order and any(a is step for a in s.ancestors()):
            best = s
    return best
