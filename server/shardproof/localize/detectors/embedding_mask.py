"""wrong-shard of a vocabulary-parallel embedding: the mask or the shift of the ids does not match
the rows the rank holds. Reads the rank's embedding weight selection and its ids' mask."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy, Site
from ..context import Context
from ..number_origin import moved_to, number_origin
from ..sites import pick_frame, to_site
from .masks import mask_interval, output_mask, output_mask_interval


def embedding_mask(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    if ref_node.op != "embedding":
        return None
    graph = ctx.ev.ranks[rank]
    nodes = ctx.rank_nodes[rank]
    weight_ref = ref_node.inputs[0]
    for node in graph.nodes:
        if node.op != "embedding":
            continue
        rows = _rows_held(ctx, weight_ref, rank, node.inputs[0])
        if rows is None:
            continue
        start, end = rows
        ids = nodes.get(node.inputs[1])
        kept, offset, mask_node = mask_interval(ctx, nodes, ids, (start, end))
        if kept is None:  # the lookup's rows zeroed after it, on clamped ids
            kept, offset, mask_node = output_mask_interval(ctx, rank, node, (start, end))
        if kept is None:
            continue
        problems = []
        if kept != (start, end):
            problems.append(
                f"the mask keeps token ids [{kept[0]}:{kept[1]}] but this rank holds embedding rows [{start}:{end}]"
            )
        if offset is not None and offset != start:
            problems.append(f"local ids are shifted by {offset} instead of {start}")
        culprit = mask_node if kept != (start, end) else ids
        zeroed = output_mask(ctx, rank, node) if not problems else None
        if zeroed is not None and (zeroed[0] != (start, end) or not zeroed[1]):
            # the ids are masked right, the lookups are zeroed otherwise: the output mask is the line
            interval, keeps, culprit = zeroed
            held = f"[{interval[0]}:{interval[1]}]"
            problems.append(
                f"the lookups of the ids {held} are kept and the others zeroed, but this rank holds embedding "
                f"rows [{start}:{end}]"
                if keeps
                else f"the lookups of the ids {held} this rank holds are zeroed and the others kept"
            )
        if not problems:
            continue
        primary = ctx.rank_site(culprit) if culprit else ctx.rank_site(node)
        rows_wrong = kept[0] != start and offset == kept[0]
        if rows_wrong:
            # the mask and the shift agree on where this rank's ids start, the rows it holds do
            # not: the rows were taken from the wrong place (where the weight was sliced)
            primary = _weight_site(ctx, rank, node.inputs[0]) or primary
        suggestion = f"keep exactly the ids in [{start}, {end}) (ids >= {start} and ids < {end}) and zero the others"
        if rows_wrong:
            suggestion = f"take the embedding rows [{kept[0]}:{kept[1]}] the mask keeps for rank {rank}"
        found = Discrepancy(
            kind="wrong-shard",
            message="vocab-parallel embedding: " + "; ".join(problems),
            primary=primary,
            reference=ctx.ref_site(ref_node, "the reference looks up every token id"),
            related=[s for s in [ctx.rank_site(node, f"the lookup in embedding rows [{start}:{end}]")] if s],
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{node.id}"],
            expected=f"rank {rank} looks up exactly the ids in [{start}:{end}] and zeroes the rest",
            found=problems[0],
            suggestion=suggestion,
        )
        return _at_rows_origin(ctx, weight_ref, node.inputs[0], found) if rows_wrong else found
    return None


def _at_rows_origin(ctx: Context, weight_ref: str, weight: str, found: Discrepancy) -> Discrepancy:
    """The report moved to where the rows' offset was computed: the cut at the weight's site that
    holds each rank's rows (the ranks' rows, so the cut is told from others on its line)."""
    if found.primary is None:
        return found
    held: dict[int, tuple[int, int]] = {}
    expected: dict[int, tuple[int, int]] = {}
    for r in range(len(ctx.ev.ranks)):
        graph, nodes = ctx.ev.ranks[r], ctx.rank_nodes[r]
        for lookup in graph.nodes:
            if lookup.op == "embedding" and lookup.inputs[0] == weight:
                kept, _, _ = mask_interval(ctx, nodes, nodes.get(lookup.inputs[1]))
                if kept is not None:
                    expected[r] = kept
        rows = _rows_held(ctx, weight_ref, r, weight)
        if rows is not None:
            held[r] = rows
    origin = number_origin(ctx.ev.rank_numbers, (found.primary.file, found.primary.line), held, expected)
    found = moved_to(found, origin) if origin is not None else found
    found.details.setdefault("number_origin", {})  # placed: not relocated again
    return found


def _rows_held(ctx: Context, weight_ref: str, rank: int, weight: str) -> tuple[int, int] | None:
    """The one block of the reference table's rows the rank's embedding weight holds, if one."""
    for rel in ctx.relations_between(weight_ref, rank, weight):
        if rel.kind == "sel" and rel.dim == -2 and len(rel.ranges) == 1:
            return rel.ranges[0]
    return None


def _weight_site(ctx: Context, rank: int, value: str) -> Site | None:
    """Where the builder sliced the rank's embedding weight (its provenance's site)."""
    placeholder = ctx.rank_placeholders[rank].get(value)
    expr = ctx.ev.rank_values[rank].get(placeholder.target) if placeholder is not None else None
    site = getattr(expr, "site", None)
    return to_site(pick_frame(site, ctx.ref_lines), "the rows this rank holds are taken here") if site else None
