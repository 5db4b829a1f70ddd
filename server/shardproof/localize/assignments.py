"""Where a number a line uses was assigned: the line to change when the number is wrong.

A wrong constant (an attention scale computed from the local head count, a divisor from the
local width) shows at the operation that uses it, but the fix is where it was computed:
`self.scale = head_dim ** -0.5` in `__init__`, or `scale = ...` earlier in the function. This
reads the user's source: the names in the expression the operation ran (its column range), and
for each the assignment that gave it its value — the last one before the line in the same
function for a local name, the assignments to `self.name` in the same class for an attribute.
Only one candidate is an answer; several (or none) leave the operation's own line, and so does a
name other lines read too (a right number used in the wrong place: the use is what to change).
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass

from ..graph.model import Frame


@dataclass(frozen=True)
class Assignment:
    file: str
    line: int
    column: int  # 0-based
    end_line: int
    end_column: int
    code: str
    name: str  # `self.scale`, `scale`
    numeric: bool  # the assigned value is computed from numbers and sizes, not tensors


def assignment_of_used_name(frame: Frame) -> Assignment | None:
    """The single assignment of the one name (or `self.` attribute) the frame's expression reads."""
    tree = _parse(frame.file)
    if tree is None or frame.column is None:
        return None
    expression = _expression_at(tree, frame)
    if expression is None:
        return None
    names = _read_names(expression)
    function, cls = _enclosing(tree, frame.line)
    found: list[Assignment] = []
    for name in names:
        if name.startswith("self."):
            found.extend(_attribute_assignments(cls, name.removeprefix("self."), frame.file))
        elif function is not None:
            local = _last_local_assignment(function, name, frame.line, frame.file)
            if local is not None:
                found.append(local)
    numeric = [a for a in found if a.numeric]
    if len(numeric) != 1:
        return None
    (assigned,) = numeric
    # A number that other lines read as well is right for them: the wrong thing is its use here.
    scope = cls if assigned.name.startswith("self.") else function
    return None if _read_elsewhere(scope, assigned.name, frame.line) else assigned


def _parse(file: str) -> ast.Module | None:
    try:
        return _parsed(file, os.stat(file).st_mtime_ns)
    except (OSError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _parsed(file: str, modified: int) -> ast.Module:
    """A file's syntax tree, per version (the editor's worker verifies again after every edit)."""
    del modified
    return ast.parse(_source(file))


def _expression_at(tree: ast.Module, frame: Frame) -> ast.AST | None:
    """The expression node spanning exactly the frame's column range (the call or op it ran)."""
    end_line = frame.end_line or frame.line
    for node in ast.walk(tree):
        if not isinstance(node, ast.expr) or getattr(node, "lineno", None) != frame.line:
            continue
        if node.col_offset == frame.column and node.end_lineno == end_line and node.end_col_offset == frame.end_column:
            return node
    return None


def _read_names(expression: ast.AST) -> list[str]:
    """Local names and `self.` attributes read in the expression, except calls' own names and
    tensors' methods (only values: `self.scale`, `scale`)."""
    names: list[str] = []
    called = {id(node.func) for node in ast.walk(expression) if isinstance(node, ast.Call)}
    for node in ast.walk(expression):
        if id(node) in called:
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.append(f"self.{node.attr}")
        elif isinstance(node, ast.Name) and node.id != "self" and isinstance(node.ctx, ast.Load):
            names.append(node.id)
    return list(dict.fromkeys(names))


def _read_elsewhere(scope: ast.AST | None, name: str, line: int) -> bool:
    """Whether `name` (a local, or `self.x`) is read on another line of the scope."""
    for node in ast.walk(scope) if scope is not None else ():
        if getattr(node, "lineno", line) == line or not isinstance(getattr(node, "ctx", None), ast.Load):
            continue
        if isinstance(node, ast.Name) and node.id == name:
            return True
        is_self = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        if is_self and f"self.{node.attr}" == name:  # type: ignore[attr-defined]
            return True
    return False


def _enclosing(tree: ast.Module, line: int) -> tuple[ast.FunctionDef | None, ast.ClassDef | None]:
    function: ast.FunctionDef | None = None
    cls: ast.ClassDef | None = None
    for node in ast.walk(tree):
        if not hasattr(node, "end_lineno") or not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        if isinstance(node, ast.FunctionDef) and (function is None or node.lineno > function.lineno):
            function = node
        elif isinstance(node, ast.ClassDef) and (cls is None or node.lineno > cls.lineno):
            cls = node
    return function, cls


def _attribute_assignments(cls: ast.ClassDef | None, attribute: str, file: str) -> list[Assignment]:
    if cls is None:
        return []
    found = []
    for node in ast.walk(cls):
        for target, value in _targets(node):
            is_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            if is_self and target.attr == attribute and target.value.id == "self":  # type: ignore[union-attr]
                found.append(_assignment(node, value, f"self.{attribute}", file))
    return found


def _last_local_assignment(function: ast.FunctionDef, name: str, before: int, file: str) -> Assignment | None:
    last = None
    for node in ast.walk(function):
        if getattr(node, "lineno", before) >= before:
            continue
        for target, value in _targets(node):
            if isinstance(target, ast.Name) and target.id == name and (last is None or node.lineno > last.line):
                last = _assignment(node, value, name, file)
    return last


def _targets(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    if isinstance(node, ast.Assign):
        return [(target, node.value) for target in node.targets]
    if isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
        return [(node.target, node.value)]
    return []


def _assignment(statement: ast.AST, value: ast.expr, name: str, file: str) -> Assignment:
    code = ast.get_source_segment(_source(file), statement) or ""
    return Assignment(
        file,
        value.lineno,
        value.col_offset,
        value.end_lineno or value.lineno,
        value.end_col_offset or value.col_offset,
        code.splitlines()[0] if code else "",
        name,
        _numeric(value),
    )


# calls that compute numbers: math's functions, builtins, and sizes read off tensors
_NUMBER_BUILTINS = {"float", "int", "abs", "round", "min", "max", "pow", "len", "sum", "divmod"}
_SIZE_METHODS = {"size", "dim", "numel", "item", "get_world_size", "get_rank"}


def _numeric(value: ast.expr) -> bool:
    """Whether an expression computes a Python number (a scale, a size), not a tensor."""
    for node in ast.walk(value):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in _NUMBER_BUILTINS:
                continue
            if isinstance(func, ast.Attribute) and (
                func.attr in _SIZE_METHODS or (isinstance(func.value, ast.Name) and func.value.id == "math")
            ):
                continue
            return False
    return True


def _source(file: str) -> str:
    with open(file, encoding="utf-8") as handle:
        return handle.read()
