"""wrong-shard of a vocabulary-parallel loss's target logit: the mask, the shift or the zeroing of
the picks does not match the classes the rank holds. Reads the logits' selection and the mask."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context
from .masks import mask_interval, zeroed_outside


def target_pick_mask(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    """A vocabulary-parallel loss picks each target's logit on the rank holding its class: it
    must pick local ids (target - start, masked) and zero the picks of targets outside its
    classes [start, end) before the all-reduce."""
    if ref_node.op != "pick":
        return None
    graph = ctx.ev.ranks[rank]
    nodes = ctx.rank_nodes[rank]
    dim = ref_node.attrs.get("dim", -1)
    for node in graph.nodes:
        if node.op != "pick":
            continue
        shard = [
            rel
            for rel in ctx.relations_between(ref_node.inputs[0], rank, node.inputs[0])
            if rel.kind == "sel" and rel.dim == dim and len(rel.ranges) == 1
        ]
        if not shard:
            continue
        start, end = shard[0].ranges[0]
        kept, offset, mask_node = mask_interval(ctx, nodes, nodes.get(node.inputs[1]), (start, end))
        problems = []
        culprit: Node | None = None
        if kept is not None and kept != (start, end):
            problems.append(f"the mask keeps targets [{kept[0]}:{kept[1]}] but this rank holds classes [{start}:{end}]")
            culprit = mask_node
        elif offset is not None and offset != start:
            problems.append(f"local target ids are shifted by {offset} instead of {start}")
            culprit = nodes.get(node.inputs[1])
        elif kept is not None and not zeroed_outside(ctx, rank, node):
            problems.append(
                f"the logits picked for targets outside [{start}:{end}] are not zeroed before the all-reduce"
            )
            culprit = node
        if not problems:
            continue
        return Discrepancy(
            kind="wrong-shard",
            message="vocab-parallel target logit: " + "; ".join(problems),
            primary=ctx.rank_site(culprit) if culprit else ctx.rank_site(node),
            reference=ctx.ref_site(ref_node, "the reference picks every target's logit"),
            related=[s for s in [ctx.rank_site(node, f"the pick from classes [{start}:{end}]")] if s],
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{node.id}"],
            expected=f"rank {rank} picks exactly the targets in [{start}:{end}] and zeroes the rest",
            found=problems[0],
            suggestion=f"mask targets outside [{start}, {end}): (targets < {start}) | (targets >= {end}), "
            "pick target - start, and zero the picks of masked targets",
        )
    return None
