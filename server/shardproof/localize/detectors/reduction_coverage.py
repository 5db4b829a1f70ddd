"""At an all-reduce whose inputs are partial sums that do not tile the reduction: wrong-shard (a
rank of its group missing, two with the same range) or wrong-group (the group is not the ranks
whose parts tile it). Reads the partial-sum relations of every rank."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy, Site
from ...verify.relations_found import Relation
from ..context import Context
from ..number_origin import cut_lines, moved_to, number_origin


def reduction_coverage(ctx: Context, ref_node: Node, ref_value: str, rank: int, reduction: Node) -> Discrepancy | None:
    """The all-reduce exists but its inputs' partial sums do not tile the reduction: a rank of its
    group holds the wrong part (reported where that part is made), or the group is the wrong one
    (other ranks hold the parts that would tile it: reported at the all-reduce)."""
    ranges: dict[int, list[Relation]] = {}
    for r in range(len(ctx.ev.ranks)):
        for rel, _values in ctx.index.relations(ref_value, r):
            if rel.kind == "psum":
                ranges.setdefault(r, []).append(rel)
    everyone = {r: (rels[0].start, rels[0].end) for r, rels in ranges.items()}
    group = reduction.collective.group if reduction.collective else tuple(range(len(ctx.ev.ranks)))
    members = [r for r in group if r < len(ctx.ev.ranks)]
    missing = [r for r in members if r not in ranges]
    held = {r: everyone[r] for r in members if r in everyone}
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
        partners = _tiling_partners(everyone, rank, len(members), total)
        if partners is not None and sorted(partners) != sorted(members):
            return _wrong_group(ctx, ref_node, rank, reduction, members, partners, found, total)
    offender = (missing or duplicated or [rank])[0]
    partial = _partial_input(ctx, offender, reduction)
    origin = _partial_site(ctx, offender, partial) if partial is not None else None
    found_discrepancy = Discrepancy(
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
    return _at_the_numbers(ctx, found_discrepancy, held, total)


def _at_the_numbers(ctx: Context, found: Discrepancy, held: dict[int, tuple[int, int]], total: int) -> Discrepancy:
    """The ranges come from cuts of a parameter whose bounds the builder computed: the report
    goes where those numbers are wrong (number_origin.py), with the cut and the partial sum as
    related information."""
    for line in cut_lines(ctx.ev.rank_numbers, held, total):
        origin = number_origin(ctx.ev.rank_numbers, line, held)
        if origin is None:
            continue
        return moved_to(found, origin)
    return found


def _tiling_partners(held: dict[int, tuple[int, int]], rank: int, size: int, total: int) -> list[int] | None:
    """`size` ranks, `rank` among them, whose parts tile [0, total): for every other part the
    nearest rank holding it (None when the parts held anywhere cannot tile it that way)."""
    if rank not in held:
        return None
    chosen = {held[rank]: rank}
    for r in sorted(held, key=lambda q: (abs(q - rank), q)):
        chosen.setdefault(held[r], r)
    if len(chosen) != size or tiling_problem({r: span for span, r in chosen.items()}, total) is not None:
        return None
    return sorted(chosen.values())


def _wrong_group(
    ctx: Context,
    ref_node: Node,
    rank: int,
    reduction: Node,
    members: list[int],
    partners: list[int],
    found: str,
    total: int,
) -> Discrepancy:
    where = ctx.rank_site(reduction).short() if reduction.site else "?"
    return Discrepancy(
        kind="wrong-group",
        message=f"the all-reduce at {where} runs over ranks {members}, whose partial sums do not tile the "
        f"reduction ({found}); ranks {partners} hold the parts that do",
        primary=ctx.rank_site(reduction, "the all-reduce's group"),
        reference=ctx.ref_site(ref_node, "the reference computes the full value here"),
        ranks=members,
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{reduction.id}"],
        expected=f"an all-reduce over ranks {partners}, whose partial sums cover all {total} reduced indices once",
        found=f"an all-reduce over ranks {members}",
        suggestion=f"reduce over the group of ranks {partners} (the group that shards this computation)",
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
