"""A small SVG picture of a discrepancy's neighbourhood, drawn by shardproof itself.

Left column: the reference's operations around the point where the relation breaks (its inputs,
then the operation). Right column: the same for one rank, with its collectives. Between them, the
relation proven for each pair (green), or the missing / wrong link (red, dashed). A required
operation that the rank does not perform (a missing all-reduce) is a dashed red box.

Input: `Discrepancy.details["neighbourhood"]` (see diagnose.neighbourhood). Output: SVG markup.
"""

from __future__ import annotations

from html import escape
from typing import Any

from ..results import Discrepancy

BOX_W, BOX_H = 230, 44
LEFT_X, RIGHT_X = 50, 470
TOP, ROW = 46, 74
OK, BROKEN, INK, MUTED = "#2e7d32", "#c62828", "#24292f", "#57606a"


def _box(
    x: int, y: int, label: str, site: str, *, broken: bool = False, dashed: bool = False, collective: bool = False
) -> str:
    stroke = BROKEN if broken else INK
    fill = "#fdecea" if broken else ("#e8f0fe" if collective else "#f6f8fa")
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    return (
        f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" stroke="{stroke}" '
        f'stroke-width="{2 if broken else 1}"{dash}/>'
        f'<text x="{x + 10}" y="{y + 19}" font-size="13" font-weight="600" fill="{stroke}">{escape(label[:30])}</text>'
        f'<text x="{x + 10}" y="{y + 36}" font-size="11" fill="{MUTED}">{escape(site[:36])}</text>'
    )


def _arrow(x: int, y1: int, y2: int, color: str = MUTED) -> str:
    return (
        f'<line x1="{x}" y1="{y1}" x2="{x}" y2="{y2 - 6}" stroke="{color}" stroke-width="1.2"/>'
        f'<path d="M{x - 4},{y2 - 8} L{x},{y2} L{x + 4},{y2 - 8} Z" fill="{color}"/>'
    )


def _link(y_left: int, y_right: int, label: str, status: str) -> str:
    color = OK if status == "ok" else BROKEN
    dash = "" if status == "ok" else ' stroke-dasharray="5 4"'
    mark = "" if status == "ok" else "✗ "
    x1, x2 = LEFT_X + BOX_W, RIGHT_X
    middle_x, middle_y = (x1 + x2) // 2, (y_left + y_right) // 2
    return (
        f'<line x1="{x1}" y1="{y_left}" x2="{x2}" y2="{y_right}" stroke="{color}" stroke-width="1.6"{dash}/>'
        f'<text x="{middle_x}" y="{middle_y - 6}" font-size="{10.5 if len(label) <= 32 else 9}" '
        f'text-anchor="middle" fill="{color}">{escape(mark + label[:40])}</text>'
    )


def _edge(points: list[tuple[int, int]], broken: bool) -> str:
    color = BROKEN if broken else MUTED
    dash = ' stroke-dasharray="4 3"' if broken else ""
    (x2, y2) = points[-1]
    path = " ".join(f"{x},{y}" for x, y in [*points[:-1], (x2, y2 - 6)])
    return (
        f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.2"{dash}/>'
        f'<path d="M{x2 - 4},{y2 - 8} L{x2},{y2} L{x2 + 4},{y2 - 8} Z" fill="{color}"/>'
    )


def _route(x: int, outer: int, source_top: int, target_top: int, lane: int) -> list[tuple[int, int]]:
    """Straight down to the next row; around the column's outer side when rows lie in between."""
    centre = x + BOX_W // 2
    if target_top - source_top <= ROW:
        return [(centre, source_top + BOX_H), (centre, target_top)]
    side = x + (BOX_W if outer > 0 else 0)
    out = side + outer * (10 + 8 * lane)
    middle = source_top + BOX_H // 2
    entry = centre + outer * (BOX_W // 2 - 18 - 8 * lane)
    return [(side, middle), (out, middle), (out, target_top - 12), (entry, target_top - 12), (entry, target_top)]


def picture(discrepancy: Discrepancy) -> str:
    data: dict[str, Any] | None = discrepancy.details.get("neighbourhood") if discrepancy.details else None
    if not data:
        return ""
    columns = {"reference": (data.get("reference", []), LEFT_X), "parallel": (data.get("parallel", []), RIGHT_X)}
    rows = 1 + max((int(n.get("row", 0)) for nodes, _ in columns.values() for n in nodes), default=0)
    height = TOP + rows * ROW + 4
    # Usually the reference against one rank; a collective mismatch sets two ranks as the titles.
    titles = list(data.get("titles") or ["reference", f"rank {data.get('rank', 0)}"])
    width = RIGHT_X + BOX_W + 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif" role="img">',
        f"<title>{escape(discrepancy.kind)}: {escape(discrepancy.message)}</title>",
        f'<text x="{LEFT_X}" y="24" font-size="13" font-weight="700" fill="{INK}">{escape(titles[0])}</text>',
        f'<text x="{RIGHT_X}" y="24" font-size="13" font-weight="700" fill="{INK}">{escape(titles[1])}</text>',
    ]

    def top(node: dict[str, Any]) -> int:
        return TOP + int(node.get("row", 0)) * ROW

    lanes: dict[str, int] = {}
    for edge in data.get("edges", []):
        nodes, x = columns[edge["column"]]
        source, target = nodes[edge["from"]], nodes[edge["to"]]
        outer = -1 if edge["column"] == "reference" else 1
        lane = 0
        if top(target) - top(source) > ROW:
            lane = lanes.get(edge["column"], 0)
            lanes[edge["column"]] = lane + 1
        parts.append(_edge(_route(x, outer, top(source), top(target), lane), bool(edge.get("broken"))))
    for nodes, x in columns.values():
        for node in nodes:
            parts.append(
                _box(
                    x,
                    top(node),
                    str(node.get("label", "")),
                    str(node.get("site", "")),
                    broken=bool(node.get("broken")),
                    dashed=bool(node.get("missing")),
                    collective=bool(node.get("collective")),
                )
            )
    for link in data.get("links", []):
        row = int(link.get("row", 0))
        y_right = TOP + row * ROW + BOX_H // 2
        y_left = TOP + int(link.get("from_row", row)) * ROW + BOX_H // 2
        parts.append(_link(y_left, y_right, str(link.get("label", "")), str(link.get("status", "ok"))))
    parts.append("</svg>")
    return "".join(parts)
