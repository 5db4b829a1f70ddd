"""wrong-shard at an all-reduce: its inputs are partial sums that do not tile the reduction (a rank
missing, two ranks with the same range). Reads the partial-sum relations of every rank."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy, Site
from ...verify.relations_found import Relation
from ..context import Context


def reduction_coverage(ctx: Context, ref_node: Node, ref_value: str, rank: int, reduction: Node) -> Discrepancy | None:
    """The all-reduce exists but its inputs' partial sums do not tile the reduction."""
    ranges: dict[int, list[Relation]] = {}
    for r in range(len(ctx.ev.ranks)):
        for rel, _values in ctx.index.relations(ref_value, r):
            if rel.kind == "psum":
                ranges.setdefault(r, []).append(rel)
    missing = [r for r in range(len(ctx.ev.ranks)) if r not in ranges]
    held = {r: (rels[0].start, rels[0].end) for r, rels in ranges.items()}
    total = next(iter(ranges.values()))[0].total if ranges else 0
    duplicated = [r for r in held for q in held if q < r and held[q] == held[r]]
    description = ", ".join(f"rank {r}: [{s}:{e}]" for r, (s, e) in sorted(held.items()))
    if missing:
        found = f"ranks {missing} hold no partial sum of it; {description}"
    else:
        problem = tiling_problem(held, total)
        if problem is None:
            return None  # the ranges tile: whatever is wrong, it is not which part each rank sums
        found = f"{problem} ({description} of {total})"
    offender = (missing or duplicated or [rank])[0]
    partial = _partial_input(ctx, offender, reduction)
    origin = _partial_site(ctx, offender, partial) if partial is not None else None
    return Discrepancy(
        kind="wrong-shard",
        message=f"the all-reduce at {ctx.rank_site(reduction).short() if reduction.site else '?'} sums partial "
        f"results that do not tile the reduction: {found}",
        primary=origin or ctx.rank_site(reduction),
        reference=ctx.ref_site(ref_node, "the reference computes the full value here"),
        related=[s for s in [ctx.rank_site(reduction, "the all-reduce")] if s],
        ranks=[offender],
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{reduction.id}"],
        expected=f"partial sums over disjoint ranges covering all {total} reduced indices, one per rank",
        found=found,
        suggestion="give every rank its own shard (rank r of n holds block r)",
    )


def tiling_problem(held: dict[int, tuple[int, int]], total: int) -> str | None:
    """What keeps the ranks' ranges from tiling [0, total) exactly once (None when they do): the
    first overlap or gap, in order along the reduced indices."""
    position, previous = 0, None
    for rank, (start, end) in sorted(held.items(), key=lambda item: (item[1], item[0])):
        if start < position:
            return f"rank {previous} and rank {rank} both sum [{start}:{min(end, position)}]"
        if start > position:
            return f"no rank sums [{position}:{start}]"
        position, previous = end, rank
    return f"no rank sums [{position}:{total}]" if position < total else None


def _partial_site(ctx: Context, rank: int, value: str) -> Site | None:
    node = ctx.rank_node(rank, value)
    if node is not None:
        return ctx.rank_site(node, "this rank's partial sum is computed here")
    return ctx.provenance_site(rank, value)


def _partial_input(ctx: Context, rank: int, reduction: Node) -> str | None:
    graph = ctx.ev.ranks[rank]
    for node in graph.nodes:
        if node.op == "all_reduce" and node.site == reduction.site:
            return node.inputs[0]
    return None
