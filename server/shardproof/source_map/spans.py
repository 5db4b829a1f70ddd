"""Map a report site to the exact expression or statement it names."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from ..results import Site


@dataclass(frozen=True, order=True)
class Span:
    """1-based lines, 0-based code-point columns, end exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int

    def contains(self, other: Span) -> bool:
        return (self.line, self.column) <= (other.line, other.column) and (other.end_line, other.end_column) <= (
            self.end_line,
            self.end_column,
        )

    def size(self) -> tuple[int, int]:
        return (self.end_line - self.line, self.end_column - self.column)


@dataclass
class ParsedSource:
    text: str
    module: cst.Module | None
    positions: dict[cst.CSTNode, Span]
    parents: dict[cst.CSTNode, cst.CSTNode]


_INTERESTING = (cst.BaseExpression, cst.BaseSmallStatement, cst.BaseCompoundStatement)


@functools.lru_cache(maxsize=64)
def parse(text: str) -> ParsedSource:
    try:
        module = cst.parse_module(text)
    except (cst.ParserSyntaxError, RecursionError):
        return ParsedSource(text, None, {}, {})
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    raw_positions = wrapper.resolve(PositionProvider)
    parents = dict(wrapper.resolve(ParentNodeProvider))
    positions = {
        node: Span(r.start.line, r.start.column, r.end.line, r.end.column)
        for node, r in raw_positions.items()
        if isinstance(node, _INTERESTING)
    }
    return ParsedSource(text, module, positions, parents)


def site_span(site: Site, text: str) -> Span:
    """The site's own range (whole line when the site has no columns)."""
    lines = text.splitlines()
    line_text = lines[site.line - 1] if 0 < site.line <= len(lines) else ""
    if site.column is None:
        stripped = len(line_text) - len(line_text.lstrip())
        return Span(site.line, stripped, site.line, len(line_text.rstrip()))
    end_line = site.end_line or site.line
    end_column = (site.end_column - 1) if site.end_column else len(line_text)
    return Span(site.line, site.column - 1, end_line, end_column)


def refine(site: Site, text: str) -> Span:
    """The smallest expression or statement containing the site's range (exact when one matches)."""
    wanted = site_span(site, text)
    parsed = parse(text)
    best: Span | None = None
    for span in parsed.positions.values():
        if span == wanted:
            return span
        if span.contains(wanted) and (best is None or span.size() < best.size()):
            best = span
    return best or wanted


def node_at(text: str, span: Span) -> cst.CSTNode | None:
    parsed = parse(text)
    exact = [n for n, s in parsed.positions.items() if s == span]
    return exact[0] if exact else None


def utf16_column(line_text: str, column: int) -> int:
    """LSP counts UTF-16 code units; Python and LibCST count code points."""
    prefix = line_text[:column]
    return len(prefix.encode("utf-16-le")) // 2
