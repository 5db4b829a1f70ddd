"""wrong-collective-op: an all-reduce that combines the ranks' partial sums with another operation
than SUM (AVG, MAX, ...), or their partial maxima with another than MAX. Its inputs are proven
parts of a reference value whose combination the relation names, so the operation is the one
thing to change. Reads the relations of every all-reduce's input and output."""

from __future__ import annotations

from ...results import Discrepancy
from ..context import Context

# the reduction a partial relation's parts need, and how the user writes it
_NEEDED = {"psum": "sum", "pmax": "max"}
_SPELLED = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


def wrong_collective_op(ctx: Context, failing_outputs: list[int]) -> Discrepancy | None:
    for rank, graph in enumerate(ctx.ev.ranks):
        for node in graph.nodes:
            coll = node.collective
            if node.op != "all_reduce" or coll is None or len(coll.group) <= 1:
                continue
            used = coll.reduce_op or "sum"
            out = ctx.index.class_of(graph.name, node.id)
            if out is not None and ctx.index.has_reference_member(out):
                continue  # it computes a reference value: whatever its op, it is right
            parts = [
                (rel, refs[0])
                for rel, refs in ctx.index.relations_of_rank_value(rank, node.inputs[0])
                if rel.kind in _NEEDED and refs
            ]
            if not parts or any(_NEEDED[rel.kind] == used for rel, _ in parts):
                continue
            rel, ref_value = parts[0]
            needed = _NEEDED[rel.kind]
            what = "partial sums" if rel.kind == "psum" else "partial maxima"
            name = ctx.ref_value_name(ref_value)
            ref_node = ctx.ref_nodes.get(ref_value)
            return Discrepancy(
                kind="wrong-collective-op",
                message=f"this all-reduce combines the ranks' {what} of {name} with op={_SPELLED.get(used, used)}; "
                f"only their {needed} is {name}",
                primary=ctx.rank_site(node, "the reduction's operation"),
                reference=ctx.ref_site(ref_node, "the reference computes the full value here") if ref_node else None,
                ranks=list(coll.group),
                reference_node=ref_value,
                parallel_nodes=[f"{graph.name}/{node.id}"],
                expected=f"op={_SPELLED[needed]}: the {needed} of the ranks' {what}",
                found=f"op={_SPELLED.get(used, used)}",
                suggestion=f"reduce with op={_SPELLED[needed]} (dist.ReduceOp.{_SPELLED[needed]})",
            )
    return None
