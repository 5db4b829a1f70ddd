"""Numbers a cut reads that were computed without the rank or the world size.

A traced number remembers how it was computed, but a number the user's code computed from
constants alone is a plain int: `per_rank = local_expert_count(EXPERTS, world_size)` whose helper
forgot the world size (`return total_experts`), or a hard-coded `rows = 16`. When such a number
is an operand of a traced computation (`first + per_rank`), the source says where it came from:
the name's assignment in the same function (or the class's `self.` assignment), and, when that
is a call of the user's own function, that function's return statement (the function is looked
up in the module that ran the line, so it is the one that ran; a function with several returns
is not followed). Each found source becomes a step of its own (op "number", no operands) that the
localizer may change like any other.
"""

from __future__ import annotations

import ast
import sys
from types import ModuleType

from ..capture.frames import is_user_file
from ..graph.model import Frame
from ..graph.numbers import NumberStep
from .assignments import _enclosing, _expression_at, _parse, _targets


def plain_operands(step: NumberStep) -> dict[int, NumberStep]:
    """For the plain operands of `step` whose source is found: operand index -> a step standing
    for that number, at the line that made it."""
    frame = step.frame
    if frame is None or frame.column is None or all(isinstance(o, NumberStep) for o in step.operands):
        return {}
    tree = _parse(frame.file)
    expression = _expression_at(tree, frame) if tree is not None else None
    nodes = _operand_nodes(expression, len(step.operands))
    if tree is None or nodes is None:
        return {}
    function, cls = _enclosing(tree, frame.line)
    found: dict[int, NumberStep] = {}
    for index, (operand, node) in enumerate(zip(step.operands, nodes, strict=True)):
        if isinstance(operand, NumberStep) or isinstance(node, ast.Constant):
            continue
        source = _source_of(node, frame, function, cls)
        if source is not None:
            # made before the computation that reads it (its place among the builder's steps)
            found[index] = NumberStep(operand, "number", (), source, order=step.order - 0.5)  # type: ignore[arg-type]
    return found


def _operand_nodes(expression: ast.AST | None, count: int) -> list[ast.expr] | None:
    if isinstance(expression, ast.BinOp) and count == 2:
        return [expression.left, expression.right]
    if isinstance(expression, ast.UnaryOp) and count == 1:
        return [expression.operand]
    if isinstance(expression, ast.Call) and len(expression.args) == count and not expression.keywords:
        return list(expression.args)
    return None


def _source_of(
    node: ast.expr, frame: Frame, function: ast.FunctionDef | None, cls: ast.ClassDef | None
) -> Frame | None:
    if isinstance(node, ast.Call):
        return _returned(node, frame.file, cls, None)
    assigned: list[tuple[ast.AST, ast.expr]] = []
    position: int | None = None
    if isinstance(node, ast.Name) and function is not None:
        assigned = _local_assignments(function, node.id, frame.line)[-1:]
        if assigned:
            position = _unpacked_position(assigned[0][0], node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        assigned = [(a, a.value) for a in _self_assignments(cls, node.attr)]
        if len(assigned) != 1:
            return None
    if not assigned:
        return None
    value_node = assigned[0][1]
    if isinstance(value_node, ast.Call):
        return _returned(value_node, frame.file, cls, position)
    if not _numeric_literals(value_node):
        return None
    return _frame_of_value(frame.file, value_node, frame.function)


def _returned(call: ast.Call, file: str, cls: ast.ClassDef | None, position: int | None) -> Frame | None:
    """The expression the called user function returns (element `position` of a returned tuple),
    when it has one return statement."""
    function = _callee(call, file, cls)
    if function is None:
        return None
    definition, defined_in = function
    returns = [n for n in ast.walk(definition) if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) != 1:
        return None
    value = returns[0].value
    assert value is not None
    if position is not None:
        if not isinstance(value, ast.Tuple) or position >= len(value.elts):
            return None
        value = value.elts[position]
    return _frame_of_value(defined_in, value, definition.name)


def _callee(call: ast.Call, file: str, cls: ast.ClassDef | None) -> tuple[ast.FunctionDef, str] | None:
    """The definition of the user function a call names: a method of the enclosing class
    (`self.f`), or a function of the module that ran the line (`f`, `module.f`)."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        if cls is None:
            return None
        methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == func.attr]
        return (methods[0], file) if len(methods) == 1 else None
    module = _module_of(file)
    if module is None:
        return None
    target: object = None
    if isinstance(func, ast.Name):
        target = vars(module).get(func.id)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        target = getattr(vars(module).get(func.value.id), func.attr, None)
    code = getattr(target, "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    tree = _parse(code.co_filename)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == code.co_name and node.lineno <= code.co_firstlineno:
            decorated = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if decorated == code.co_firstlineno or node.lineno == code.co_firstlineno:
                return node, code.co_filename
    return None


def _module_of(file: str) -> ModuleType | None:
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == file:
            return module
    return None


def _unpacked_position(statement: ast.AST, name: str) -> int | None:
    for target, _ in _targets(statement):
        if isinstance(target, ast.Tuple):
            for position, element in enumerate(target.elts):
                if isinstance(element, ast.Name) and element.id == name:
                    return position
    return None


def _numeric_literals(node: ast.expr) -> bool:
    """An expression of number literals and arithmetic only (`16`, `4 * 8`)."""
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    return all(isinstance(n, allowed) for n in ast.walk(node)) and all(
        isinstance(n.value, int | float) and not isinstance(n.value, bool)
        for n in ast.walk(node)
        if isinstance(n, ast.Constant)
    )


def _local_assignments(function: ast.FunctionDef, name: str, before: int) -> list[tuple[ast.AST, ast.expr]]:
    """The assignments of `name` (alone or unpacked from a tuple) before the line, in order."""
    found: list[tuple[ast.AST, ast.expr]] = []
    for statement in ast.walk(function):
        if getattr(statement, "lineno", before) >= before:
            continue
        for target, value in _targets(statement):
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            if any(isinstance(t, ast.Name) and t.id == name for t in names):
                found.append((statement, value))
    return sorted(found, key=lambda item: item[0].lineno)  # type: ignore[attr-defined]


def _self_assignments(cls: ast.ClassDef | None, attribute: str) -> list[ast.Assign]:
    if cls is None:
        return []
    found = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                is_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                if is_self and target.attr == attribute and target.value.id == "self":  # type: ignore[union-attr]
                    found.append(node)
    return found


def _frame_of_value(file: str, value: ast.expr, function: str) -> Frame:
    import linecache

    return Frame(
        file,
        value.lineno,
        function,
        linecache.getline(file, value.lineno).strip(),
        value.col_offset,
        value.end_lineno,
        value.end_col_offset,
    )
