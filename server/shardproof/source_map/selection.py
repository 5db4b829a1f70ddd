"""Read how a line selects part of a sequence: `reference.layers[start : start + per_stage]`.

A split of layers over pipeline stages is plain Python arithmetic. When the split leaves layers
to no rank, the mistake is in the bound that is wrong: the offset (`start`) when the stages'
blocks do not follow each other, the length (`per_stage`) when they do but are too short. This
module finds the slice on a line and the local assignments its bounds read, so the report can
point at the assignment instead of at the slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .spans import Span, parse


@dataclass(frozen=True)
class Definition:
    """The last assignment of a local name before the slice, in the same function."""

    name: str
    span: Span
    code: str


@dataclass(frozen=True)
class SliceSelection:
    sequence: str  # the code of the sliced value (`reference.layers`)
    span: Span  # the subscript
    offset: list[Definition] = field(default_factory=list)  # what the lower bound reads
    length: list[Definition] = field(default_factory=list)  # what only the upper bound reads


def slice_selection(text: str, line: int) -> SliceSelection | None:
    """The first `sequence[lower:upper]` on `line` with both bounds, or None."""
    parsed = parse(text)
    if parsed.module is None:
        return None
    candidates = [
        (span, node)
        for node, span in parsed.positions.items()
        if isinstance(node, cst.Subscript) and span.line <= line <= span.end_line and _bounds(node) is not None
    ]
    if not candidates:
        return None
    span, subscript = min(candidates, key=lambda item: item[0])
    bounds = _bounds(subscript)
    assert bounds is not None
    lower, upper = bounds
    lower_names, upper_names = _names(lower), _names(upper)
    function = _enclosing_function(subscript, parsed.parents)
    assignments = _assignments_before(function, span.line, parsed.positions, text) if function is not None else {}
    offset = [assignments[n] for n in lower_names if n in assignments]
    only_upper = [n for n in upper_names if n not in lower_names]
    # `start : start + per_stage` reads the length in `per_stage`; `r * n : (r + 1) * n` has no
    # name of its own in the upper bound, and its local names are the length
    length = [assignments[n] for n in (only_upper or upper_names) if n in assignments]
    return SliceSelection(parsed.module.code_for_node(subscript.value), span, offset, length)


def _bounds(subscript: cst.Subscript) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if len(subscript.slice) != 1:
        return None
    element = subscript.slice[0].slice
    if not isinstance(element, cst.Slice) or element.lower is None or element.upper is None:
        return None
    return element.lower, element.upper


class _NameCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: list[str] = []

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # `reference.layers`: `reference` is read, `layers` is not a name
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value not in self.names:
            self.names.append(node.value)


def _names(expression: cst.BaseExpression) -> list[str]:
    collector = _NameCollector()
    expression.visit(collector)
    return collector.names


def _enclosing_function(node: cst.CSTNode, parents: dict[cst.CSTNode, cst.CSTNode]) -> cst.FunctionDef | None:
    current = parents.get(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = parents.get(current)
    return current


def _assignments_before(
    function: cst.FunctionDef, line: int, positions: dict[cst.CSTNode, Span], text: str
) -> dict[str, Definition]:
    """Each local name's last simple assignment (`name = ...`, `name: T = ...`, `name += ...`)
    that starts before `line`, in `function`'s own body (nested functions excepted)."""
    found: dict[str, tuple[Span, Definition]] = {}
    lines = text.splitlines()

    class Visitor(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def _record(self, statement: cst.CSTNode, targets: list[cst.BaseExpression]) -> None:
            span = positions.get(statement)
            if span is None or span.line >= line:
                return
            code = lines[span.line - 1].strip() if span.line <= len(lines) else ""
            for target in targets:
                if isinstance(target, cst.Name) and (target.value not in found or found[target.value][0] < span):
                    found[target.value] = (span, Definition(target.value, span, code))

        def visit_Assign(self, node: cst.Assign) -> None:
            self._record(node, [t.target for t in node.targets])

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if node.value is not None:
                self._record(node, [node.target])

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            self._record(node, [node.target])

    function.visit(Visitor())
    return {name: definition for name, (_, definition) in found.items()}
