"""The traced number an operation's constant came from: a module attribute the builder computed
(`self.scale = 1.0 / math.sqrt(self.q_size)`), read by the forward as a plain number.

The operation's own line says which name it reads (`scores * scale`); a parameter of a helper
(`def attention(q, k, v, scale)`) is followed to the argument its caller passed at the frame
above (`attention(q, k, v, self.scale)`); a `self.` attribute is looked up among the numbers the
rank's builder left on instances of the enclosing class (capture/numbers.py, plain_attributes).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from ..graph.model import Frame, SourceSite
from ..graph.numbers import BuilderNumbers, NumberStep
from .assignments import _enclosing, _expression_at, _parse, _read_names


def kept_number(
    site: SourceSite | None, frame: Frame, numbers: BuilderNumbers, matches: Callable[[float], bool]
) -> tuple[NumberStep, str] | None:
    """The traced attribute, among the names the expression at `frame` reads, whose value
    `matches` (the number the operation used), and the name as written where it is read from
    the attribute (`self.scale`)."""
    if site is None or frame not in site.frames:
        return None
    found = []
    tree = _parse(frame.file)
    expression = _expression_at(tree, frame) if tree is not None and frame.column is not None else None
    for name in _read_names(expression) if expression is not None else []:
        kept = _attribute_read(list(site.frames), site.frames.index(frame), frame, name, numbers)
        if kept is not None and matches(float(kept[0].value)):
            found.append(kept)
    return found[0] if len(found) == 1 else None


def kept_factor(
    site: SourceSite | None, frame: Frame, numbers: BuilderNumbers, used: float
) -> tuple[NumberStep, str] | None:
    """`kept_number` for an operation's factor: the number itself, or its inverse (x / c written
    as x * (1 / c))."""

    def holds(value: float) -> bool:
        return math.isclose(float(used), value, rel_tol=1e-9) or (
            value != 0 and math.isclose(float(used), 1 / value, rel_tol=1e-9)
        )

    return kept_number(site, frame, numbers, holds)


def _attribute_read(
    frames: list[Frame], position: int, frame: Frame, name: str, numbers: BuilderNumbers
) -> tuple[NumberStep, str] | None:
    """`name` read at `frame`, followed through helpers' parameters to a `self.` attribute."""
    current = frame
    for _ in range(4):  # a helper's parameter, passed down a few calls at most
        tree = _parse(current.file)
        if tree is None:
            return None
        function, cls = _enclosing(tree, current.line)
        if name.startswith("self."):
            if cls is None:
                return None
            step = numbers.attribute(current.file, cls.name, name.removeprefix("self."))
            return (step, name) if step is not None else None
        if function is None or position == 0:
            return None
        index = _parameter_index(function, name)
        if index is None:
            return None
        caller = frames[position - 1]
        argument = _argument(caller, function.name, index)
        if argument is None:
            return None
        names = (
            _read_names(argument_expression)
            if (argument_expression := _expression_at(_parse(caller.file), argument))
            else []
        )
        if len(names) != 1:
            return None
        current, position, name = argument, position - 1, names[0]
    return None


def _parameter_index(function: ast.FunctionDef, name: str) -> int | None:
    arguments = [a.arg for a in function.args.posonlyargs + function.args.args]
    return arguments.index(name) if name in arguments else None


def _argument(caller: Frame, called: str, index: int) -> Frame | None:
    """The caller's argument at `index` of its call to `called`, as a frame spanning it."""
    tree = _parse(caller.file)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or getattr(node, "lineno", None) != caller.line:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name != called:
            continue
        is_method = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        position = index - 1 if is_method else index
        if not 0 <= position < len(node.args):
            return None
        argument = node.args[position]
        return Frame(
            caller.file,
            argument.lineno,
            caller.function,
            caller.code,
            argument.col_offset,
            argument.end_lineno,
            argument.end_col_offset,
        )
    return None
