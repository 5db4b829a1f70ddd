"""collective-mismatch: the ranks of a group make different sequences of collective calls (the
encoder found the calls cannot pair up). Reads the encoder's collective issues."""

from __future__ import annotations

from typing import Any

from ...results import Discrepancy
from ...verify.encode import CollectiveIssue
from ..context import Context


def collective_mismatch(ctx: Context, issue: CollectiveIssue) -> Discrepancy:
    graph_name, node_id = issue.nodes[0] if issue.nodes else ("", "")
    rank = int(graph_name.removeprefix("rank")) if graph_name.startswith("rank") else 0
    node = ctx.rank_node(rank, node_id)
    related = []
    for other_graph, other_id in issue.nodes[1:4]:
        other_rank = int(other_graph.removeprefix("rank"))
        other = ctx.rank_node(other_rank, other_id)
        if other is not None:
            related.append(ctx.rank_site(other, f"rank {other_rank}: {other.op}"))
    found = Discrepancy(
        kind="collective-mismatch",
        message=issue.message,
        primary=ctx.rank_site(node) if node else None,
        related=[s for s in related if s],
        ranks=list(issue.group),
        parallel_nodes=[f"{g}/{n}" for g, n in issue.nodes],
        expected="every rank of the group makes the same sequence of collective calls",
        found=issue.message,
        suggestion="make every rank of the group call the same collectives in the same order",
    )
    found.details["neighbourhood"] = _collective_picture(ctx, issue)
    return found


def _collective_picture(ctx: Context, issue: CollectiveIssue) -> dict[str, Any]:
    """Two ranks side by side: the collective call each makes at the position where they disagree."""
    columns: list[list[dict[str, Any]]] = [[], []]
    titles = []
    for column, (graph_name, node_id) in enumerate(issue.nodes[:2]):
        rank = int(graph_name.removeprefix("rank")) if graph_name.startswith("rank") else column
        titles.append(f"rank {rank}")
        node = ctx.rank_node(rank, node_id)
        row = (
            ctx._rank_row(rank, node_id, broken=True)
            if node is not None
            else {"label": "no collective", "site": "missing here", "missing": True, "broken": True}
        )
        columns[column].append({**row, "row": 0})
    if len(issue.nodes) < 2:
        titles.append("other ranks")
        columns[1].append({"label": "no collective", "site": "missing here", "missing": True, "broken": True, "row": 0})
    return {
        "rank": 0,
        "titles": titles,
        "reference": columns[0],
        "parallel": columns[1],
        "links": [{"row": 0, "label": "collective calls differ", "status": "broken"}],
        "edges": [],
    }
