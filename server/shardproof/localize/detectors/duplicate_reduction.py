"""duplicate-reduction: an all-reduce whose input already equals a reference value on every rank
multiplies it by the group size. Reads the relations of every all-reduce's input and output."""

from __future__ import annotations

from typing import Any

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context


def duplicate_reduction(ctx: Context) -> Discrepancy | None:
    """An all-reduce whose input already equals a reference value: it multiplies by the group size."""
    for rank, graph in enumerate(ctx.ev.ranks):
        correct_lines = ctx._correct_collective_lines(rank)
        for node in graph.nodes:
            if node.op != "all_reduce" or node.collective is None or node.collective.reduce_op != "sum":
                continue
            if len(node.collective.group) <= 1:
                continue
            source = node.inputs[0]
            c = ctx.index.class_of(graph.name, source)
            out_c = ctx.index.class_of(graph.name, node.id)
            if c is None or not ctx.index.has_reference_member(c):
                continue
            if out_c is not None and ctx.index.has_reference_member(out_c):
                continue
            if not _held_alike(ctx, node, c):
                continue  # another rank adds something else: its own part (an expert-parallel partial sum)
            ref_value = ctx.index.reference_values(c)[0]
            ref_node = ctx.ref_nodes.get(ref_value)
            producer = ctx.rank_node(rank, source)
            related = []
            if producer is not None:
                related.append(ctx.rank_site(producer, "the value is already complete here"))
            if ref_node is not None:
                related.append(ctx.ref_site(ref_node, "the reference value it already equals"))
            n = len(node.collective.group)
            topo = ctx.topo.get(ref_value, 0)
            return Discrepancy(
                kind="duplicate-reduction",
                message=f"this all-reduce sums a value that every rank already holds in full "
                f"({ctx.ref_value_name(ref_value)}), so the result is {n}x too large",
                primary=ctx.rank_site(node, innocent=correct_lines),
                reference=ctx.ref_site(ref_node) if ref_node else None,
                related=[s for s in related if s],
                ranks=list(node.collective.group),
                reference_node=ref_value,
                parallel_nodes=[f"{graph.name}/{node.id}"],
                expected=f"rank {rank} holds {ctx.ref_value_name(ref_value)} in full (replicated)",
                found=f"the all-reduce adds the {n} identical copies",
                suggestion="remove the second all-reduce (the value was reduced already)",
                details={
                    "topo": topo,
                    "culprit": f"{graph.name}/{node.id}",
                    "fix": {"action": "unwrap", "title": "Remove the duplicate all-reduce"},
                    "neighbourhood": _duplicate_picture(ctx, rank, ref_value, source, node),
                },
            )
    return None


def _held_alike(ctx: Context, node: Node, c: int) -> bool:
    """Whether every rank of the all-reduce's group that makes the same call adds the same value
    (e-class `c`): then the sum is that value times the group size. A rank whose call adds another
    value (the reference's running sum over some experts on one rank, the rest on another) is
    not reducing a complete value twice."""
    assert node.collective is not None
    for member in node.collective.group:
        if member >= len(ctx.ev.ranks):
            continue
        same_call = ctx.rank_node(member, node.id)
        if same_call is None or same_call.op != "all_reduce" or not same_call.inputs:
            continue  # the call is written differently there: nothing to compare
        if ctx.index.class_of(ctx.ev.ranks[member].name, same_call.inputs[0]) != c:
            return False
    return True


def _duplicate_picture(ctx: Context, rank: int, ref_value: str, source: str, reduction: Node) -> dict[str, Any]:
    times = len(reduction.collective.group) if reduction.collective else "n"
    reference = [{**ctx._ref_row(ref_value), "row": 0}]
    parallel = [
        {**ctx._rank_row(rank, source), "row": 0},
        {**ctx._rank_row(rank, reduction.id, broken=True), "label": "all-reduce (again)", "row": 1},
    ]
    links = [
        {"row": 0, "label": "replicated: already complete", "status": "ok"},
        {"row": 1, "from_row": 0, "label": f"{times}x the reference value", "status": "broken"},
    ]
    edges = [{"column": "parallel", "from": 0, "to": 1, "broken": True}]
    return {"rank": rank, "reference": reference, "parallel": parallel, "links": links, "edges": edges}
