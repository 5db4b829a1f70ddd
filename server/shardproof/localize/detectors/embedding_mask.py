"""wrong-shard of a vocabulary-parallel embedding: the mask or the shift of the ids does not match
the rows the rank holds. Reads the rank's embedding weight selection and its ids' mask."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context
from .masks import mask_interval


def embedding_mask(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    if ref_node.op != "embedding":
        return None
    graph = ctx.ev.ranks[rank]
    nodes = ctx.rank_nodes[rank]
    weight_ref = ref_node.inputs[0]
    for node in graph.nodes:
        if node.op != "embedding":
            continue
        shard = [
            rel
            for rel in ctx.relations_between(weight_ref, rank, node.inputs[0])
            if rel.kind == "sel" and rel.dim == -2 and len(rel.ranges) == 1
        ]
        if not shard:
            continue
        start, end = shard[0].ranges[0]
        ids = nodes.get(node.inputs[1])
        kept, offset, mask_node = mask_interval(ctx, nodes, ids, (start, end))
        if kept is None:
            continue
        problems = []
        if kept != (start, end):
            problems.append(
                f"the mask keeps token ids [{kept[0]}:{kept[1]}] but this rank holds embedding rows [{start}:{end}]"
            )
        if offset is not None and offset != start:
            problems.append(f"local ids are shifted by {offset} instead of {start}")
        if not problems:
            continue
        culprit = mask_node if kept != (start, end) else ids
        return Discrepancy(
            kind="wrong-shard",
            message="vocab-parallel embedding: " + "; ".join(problems),
            primary=ctx.rank_site(culprit) if culprit else ctx.rank_site(node),
            reference=ctx.ref_site(ref_node, "the reference looks up every token id"),
            related=[s for s in [ctx.rank_site(node, f"the lookup in embedding rows [{start}:{end}]")] if s],
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{node.id}"],
            expected=f"rank {rank} looks up exactly the ids in [{start}:{end}] and zeroes the rest",
            found=problems[0],
            suggestion=f"keep exactly the ids in [{start}, {end}) (ids >= {start} and ids < {end}) and zero the others",
        )
    return None
