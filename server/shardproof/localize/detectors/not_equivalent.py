"""not-equivalent: the last resort at a broken value: the rank computes nothing related to it."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy, Unsupported
from ..context import Context


def not_equivalent(ctx: Context, ref_node: Node, rank: int, ranks: list[int]) -> Discrepancy | Unsupported:
    unsupported = ctx._unsupported(ref_node, rank)
    if unsupported is not None:
        return unsupported
    aligned = ctx.aligned(ref_node, rank)
    return Discrepancy(
        kind="not-equivalent",
        message=f"rank {rank} computes nothing equal or related to {ctx.ref_value_name(ref_node.id)}",
        primary=ctx.rank_site(aligned) if aligned else None,
        reference=ctx.ref_site(ref_node, "the reference computes this value here"),
        ranks=ranks,
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{aligned.id}"] if aligned else [],
        expected=f"a value related to {ctx.ref_value_name(ref_node.id)}",
        found="no related value",
        details={"culprit": f"rank{rank}/{aligned.id}"} if aligned else {},
    )
