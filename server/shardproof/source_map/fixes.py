"""Text edits for the mechanical fixes a discrepancy can carry.

A discrepancy's `details["fix"]` names the intent (domain data from localization):

  {"action": "wrap", "function": "reduce_from_tp"}       insert the missing all-reduce around the
                                                         expression at the primary site
  {"action": "unwrap"}                                  remove the duplicate all-reduce call at the
                                                         primary site, keeping its argument
  {"action": "move-out", "function": "reduce_from_tp"}  `f(a + bias)` at the primary site's add
                                                         becomes `f(a) + bias`

Edits are computed on the text the user has and only when the code has the expected shape
(the function is defined or imported in the file, the call has one argument, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst

from ..results import Discrepancy
from .spans import Span, node_at, parse, refine


@dataclass(frozen=True)
class Edit:
    span: Span
    new_text: str


def _text_of(text: str, span: Span) -> str:
    lines = text.splitlines(keepends=True)
    if span.line == span.end_line:
        return lines[span.line - 1][span.column : span.end_column]
    parts = [lines[span.line - 1][span.column :]]
    parts.extend(lines[span.line : span.end_line - 1])
    parts.append(lines[span.end_line - 1][: span.end_column])
    return "".join(parts)


def _defines(text: str, name: str) -> bool:
    """Is `name` defined or imported at the top level of this module?"""
    module = parse(text).module
    if module is None:
        return False
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef | cst.ClassDef) and statement.name.value == name:
            return True
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.ImportFrom | cst.Import) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname else alias.name
                        if isinstance(bound, cst.Name) and bound.value == name:
                            return True
                if isinstance(small, cst.Assign):
                    for target in small.targets:
                        if isinstance(target.target, cst.Name) and target.target.value == name:
                            return True
    return False


def _call_name(call: cst.Call) -> str | None:
    func = call.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def mechanical_fix(discrepancy: Discrepancy, text: str) -> list[Edit] | None:
    fix: dict[str, Any] | None = discrepancy.details.get("fix") if discrepancy.details else None
    if not fix or discrepancy.primary is None or parse(text).module is None:
        return None
    span = refine(discrepancy.primary, text)
    node = node_at(text, span)
    action = fix.get("action")
    if action == "wrap":
        function = str(fix.get("function", ""))
        if not function or not _defines(text, function) or not isinstance(node, cst.BaseExpression):
            return None
        return [Edit(span, f"{function}({_text_of(text, span)})")]
    if action == "unwrap":
        if not isinstance(node, cst.Call) or len(node.args) != 1 or node.args[0].keyword is not None:
            return None
        inner = parse(text).positions.get(node.args[0].value)
        if inner is None:
            return None
        return [Edit(span, _text_of(text, inner))]
    if action == "move-out":
        function = str(fix.get("function", ""))
        if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, cst.Add):
            return None
        parsed = parse(text)
        arg = parsed.parents.get(node)
        call = parsed.parents.get(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or len(call.args) != 1 or _call_name(call) != function:
            return None
        call_span = parsed.positions.get(call)
        left, right = parsed.positions.get(node.left), parsed.positions.get(node.right)
        if call_span is None or left is None or right is None:
            return None
        func_text = _text_of(text, parsed.positions[call.func]) if call.func in parsed.positions else function
        return [Edit(call_span, f"{func_text}({_text_of(text, left)}) + {_text_of(text, right)}")]
    return None
