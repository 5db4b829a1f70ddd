"""Who decides an argument of a call: the line that makes the call, or its caller.

A helper that reduces with the operation it is given (`def all_reduce(t, op=SUM): dist.all_reduce(t,
op=op)`) runs its collective on its own line, but the operation is its caller's choice: the caller
passes it, or leaves the default. When a report's line passes an argument that is a parameter of
the function the line is in, the line to change is the caller's (and, while each caller passes its
own parameter on, the caller's caller). Reads the user's source (assignments.py's parser).
"""

from __future__ import annotations

import ast

from ..graph.model import Frame, SourceSite
from .assignments import _enclosing, _expression_at, _parse


def deciding_frame(site: SourceSite | None, frame: Frame | None, keyword: str, position: int) -> Frame | None:
    """The caller's frame that decides the argument `keyword` (or the positional one at `position`)
    of the call at `frame`, when the call passes it on from a parameter; None when the call's own
    line decides it (a literal, a local value, the callee's default)."""
    if site is None or frame is None or frame not in site.frames:
        return None
    frames = list(site.frames)
    index = frames.index(frame)
    current, deciding = frame, None
    while index > 0:
        tree = _parse(current.file)
        call = _expression_at(tree, current) if tree is not None else None
        if not isinstance(call, ast.Call):
            break
        passed = _argument(call, keyword, position)
        function, _ = _enclosing(tree, current.line)  # type: ignore[arg-type]
        parameters = _parameters(function)
        if not isinstance(passed, ast.Name) or passed.id not in parameters:
            break
        caller = frames[index - 1]
        if caller.library is not None:
            break
        # the caller passes the parameter by that name, or at its place among the arguments
        keyword, position = passed.id, parameters.index(passed.id)
        if parameters and parameters[0] in ("self", "cls"):
            position -= 1
        current, deciding, index = caller, caller, index - 1
    return deciding


def _argument(call: ast.Call, keyword: str, position: int) -> ast.expr | None:
    for passed in call.keywords:
        if passed.arg == keyword:
            return passed.value
    if 0 <= position < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return None


def _parameters(function: ast.FunctionDef | None) -> list[str]:
    if function is None:
        return []
    arguments = function.args
    return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
