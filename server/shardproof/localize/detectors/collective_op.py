"""wrong-collective-op: a reducing collective (all-reduce, reduce-scatter) that combines the ranks'
partial sums with another operation than SUM (AVG, MAX, ...), or their partial maxima with another
than MAX. Its inputs are proven parts of a reference value whose combination the relation names,
so the operation is the one thing to change. Reads the relations of every reducing collective's
input and output.

The input need not be the part itself: a reduce-scatter usually reads the partial sums rearranged
first (Megatron's sequence parallelism transposes them so the sequence leads). Every index map
(view, permute, slice, expand: out[i] = in[f(i)]) commutes with an elementwise reduction over the
ranks, f(p_0) + f(p_1) = f(p_0 + p_1) and max likewise, so the same rearrangement of partial sums
on every rank is partial sums of the rearranged value, and needs the same operation."""

from __future__ import annotations

from dataclasses import dataclass

from ...graph.model import Node
from ...results import Discrepancy, Site
from ...verify.relations_found import Relation
from ..context import INDEX_MAPS, Context
from ..passed_arguments import deciding_frame
from ..sites import to_site
from ..wording import describe_op

# the reduction a partial relation's parts need, and how the user writes it
_NEEDED = {"psum": "sum", "pmax": "max"}
_SPELLED = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}
_REDUCING = ("all_reduce", "reduce_scatter")
# where torch.distributed's calls take the operation when it is passed by position:
# all_reduce(tensor, op), reduce_scatter_tensor(output, input, op) / reduce_scatter(output, inputs, op)
_OP_POSITION = {"all_reduce": 1, "reduce_scatter": 2}
# (a `frac` output is a share of the value: an AVG of partial sums is the value over the group size)
_DEPTH = 8


@dataclass(frozen=True)
class _Parts:
    """A rank value that is the ranks' parts of a reference value, maybe rearranged."""

    relation: Relation
    ref_value: str
    rearranged_by: tuple[Node, ...]  # the index maps from the part to the collective's input

    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        """What must be the same on every rank for the parts to combine into one value."""
        moves = tuple((n.op, repr(sorted(n.attrs.items()))) for n in self.rearranged_by)
        return self.relation.kind, self.ref_value, moves


def wrong_collective_op(ctx: Context, failing_outputs: list[int]) -> Discrepancy | None:
    for rank, graph in enumerate(ctx.ev.ranks):
        for node in graph.nodes:
            coll = node.collective
            if node.op not in _REDUCING or coll is None or len(coll.group) <= 1:
                continue
            used = coll.reduce_op or "sum"
            if any(rel.kind != "frac" for rel, _ in ctx.index.relations_of_rank_value(rank, node.id)):
                continue  # it computes a reference value or its block: whatever its op, it is right
            parts = parts_of(ctx, rank, node.inputs[0])
            if parts is None or _NEEDED[parts.relation.kind] == used:
                continue
            if any(_counterpart_differs(ctx, other, node, parts) for other in coll.group if other != rank):
                continue  # the ranks combine different things: not one value's parts
            return _report(ctx, rank, node, used, parts)
    return None


def parts_of(ctx: Context, rank: int, value: str) -> _Parts | None:
    """The partial sums (or maxima) of a reference value that `value` is, directly or through index
    maps; None when it is something else (a full value, a shard, nothing related)."""
    moved: list[Node] = []
    for _ in range(_DEPTH):
        relations = ctx.index.relations_of_rank_value(rank, value)
        parts = [(rel, refs[0]) for rel, refs in relations if rel.kind in _NEEDED and refs]
        if parts:
            return _Parts(parts[0][0], parts[0][1], tuple(reversed(moved)))
        if relations:
            return None
        node = ctx.rank_node(rank, value)
        # an index map of parts commutes with any elementwise reduction over the ranks
        if node is None or node.op not in INDEX_MAPS or not node.inputs:
            return None
        moved.append(node)
        value = node.inputs[0]
    return None


def _counterpart_differs(ctx: Context, rank: int, node: Node, parts: _Parts) -> bool:
    """Whether `rank`'s same collective call reads something else than `parts` (other parts, or
    parts rearranged otherwise)."""
    counterpart = ctx.rank_node(rank, node.id)
    if counterpart is None or counterpart.op != node.op or not counterpart.inputs:
        return False  # (the calls are matched by the encoder; this one is not found by name)
    theirs = parts_of(ctx, rank, counterpart.inputs[0])
    return theirs is None or theirs.key() != parts.key()


def _report(ctx: Context, rank: int, node: Node, used: str, parts: _Parts) -> Discrepancy:
    coll = node.collective
    assert coll is not None
    needed = _NEEDED[parts.relation.kind]
    what = "partial sums" if parts.relation.kind == "psum" else "partial maxima"
    name = ctx.ref_value_name(parts.ref_value)
    if parts.rearranged_by:
        moves = ", ".join(describe_op(n) for n in parts.rearranged_by)
        name_as_read = f"{name} (rearranged by {moves} on every rank)"
    else:
        name_as_read = name
    collective = describe_op(node)
    result = "that value, each rank keeping its block" if node.op == "reduce_scatter" else name
    ref_node = ctx.ref_nodes.get(parts.ref_value)
    primary = ctx.rank_site(node, "the reduction's operation")
    related: list[Site] = []
    # a helper reducing with the operation it is given: its caller chose the operation
    deciding = deciding_frame(node.site, ctx.rank_frame(node), "op", _OP_POSITION[node.op])
    if deciding is not None and (chosen := to_site(deciding, "the reduction's operation is chosen here")) is not None:
        related, primary = [site for site in [primary] if site is not None], chosen
    return Discrepancy(
        kind="wrong-collective-op",
        message=f"this {collective} combines the ranks' {what} of {name_as_read} with "
        f"op={_SPELLED.get(used, used)}; only their {needed} is {result}",
        primary=primary,
        related=related,
        reference=ctx.ref_site(ref_node, "the reference computes the full value here") if ref_node else None,
        ranks=list(coll.group),
        reference_node=parts.ref_value,
        parallel_nodes=[f"{ctx.ev.ranks[rank].name}/{node.id}"],
        expected=f"op={_SPELLED[needed]}: the {needed} of the ranks' {what}",
        found=f"op={_SPELLED.get(used, used)}",
        suggestion=f"reduce with op={_SPELLED[needed]} (dist.ReduceOp.{_SPELLED[needed]})",
    )
