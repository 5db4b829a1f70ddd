"""skipped-operation: a rank uses or returns one input of a reference operation where the
reference uses or returns that operation's result (a residual add, a bias, an activation left out
while everything before it was computed right). Reads the rank's outputs, the rank operations
playing the parts of the broken value's consumers, and their inputs' relations."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context
from ..wording import describe_op

# how the rank's value may hold the skipped operation's input: in full, or its block (a shard)
_HELD = ("equal", "sel")
# operations that compute from their inputs where they are: one left out leaves the rank's value
# the input's (a selection or a regrouping left out is a question of the layout instead)
_COMPUTING = ("binary", "unary", "scalar", "softmax", "log_softmax")


def skipped_operation(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    """The broken value's operation is missing on the rank: where the reference returns it, the
    rank returns one of its inputs; where a reference operation reads it, the rank operation
    playing that part reads one of its inputs. Reported at the rank's line that returns or reads
    the input in the operation's place."""
    if ref_node.op not in _COMPUTING:
        return None
    graph = ctx.ev.ranks[rank]
    for position, ref_output in enumerate(ctx.reference.outputs):
        if ref_output == ref_node.id and position < len(graph.outputs):
            returned = ctx.rank_node(rank, graph.outputs[position])
            found = _skipped(ctx, ref_node, rank, returned, returned.id) if returned is not None else None
            if found is not None:
                return found
    for consumer_id in ctx.reference.consumers().get(ref_node.id, []):
        consumer = ctx.ref_nodes[consumer_id]
        counterpart = ctx.aligned(consumer, rank)
        if counterpart is None or _applied_to_another(ctx, rank, counterpart, ref_node):
            continue  # nothing plays the part, or the rank applies the operation to another operand
        for k, value in enumerate(consumer.inputs):
            if value != ref_node.id:
                continue
            # the operands of an add or a product may come in either order
            positions = (
                range(len(counterpart.inputs)) if _commutes(consumer) else [k] if k < len(counterpart.inputs) else []
            )
            for position in positions:
                found = _skipped(ctx, ref_node, rank, counterpart, counterpart.inputs[position], consumer)
                if found is not None:
                    return found
    return None


def _applied_to_another(ctx: Context, rank: int, counterpart: Node, ref_node: Node) -> bool:
    """Whether an input of the rank's operation is made by the operation the reference applies
    (the silu applied to up where the reference applies it to gate): nothing is left out."""
    for value in counterpart.inputs:
        made = ctx.rank_node(rank, value)
        if made is not None and made.op == ref_node.op and made.attrs.get("fn") == ref_node.attrs.get("fn"):
            return True
    return False


def _commutes(node: Node) -> bool:
    return node.op == "binary" and node.attrs.get("fn") in ("add", "mul")


def _skipped(
    ctx: Context, ref_node: Node, rank: int, at: Node, value: str, consumer: Node | None = None
) -> Discrepancy | None:
    """The report when the rank's `value` (returned by `at`, or read by `at` in the consumer's
    place) holds an input of `ref_node` as the reference computes it."""
    for ref_input in ref_node.inputs:
        held = [rel for rel in ctx.relations_between(ref_input, rank, value) if rel.kind in _HELD and not rel.perm]
        if not held:
            continue
        what = ctx._holding(held[0], ref_input)
        others = [ctx.ref_value_name(v) for v in ref_node.inputs if v != ref_input]
        operation = f"the {describe_op(ref_node)} of it" + (f" and {', '.join(others)}" if others else "")
        made = ctx.rank_node(rank, value)
        made_by = ctx.ref_nodes.get(ref_input)
        if made is not None and made_by is not None and made.op == made_by.op and made_by.site == ref_node.site:
            # the reference makes the input and the operation in one call (a linear and its bias):
            # the rank's call that makes the input is the one that leaves the operation out
            at = made
            uses = f"makes {what} with its {describe_op(made)}, where the reference's call also applies {operation}"
        elif consumer is None:
            uses = f"returns {what}, where the reference returns {operation}"
        else:
            uses = f"applies the {describe_op(at)} to {what}, where the reference applies it to {operation}"
        return Discrepancy(
            kind="skipped-operation",
            message=f"rank {rank} {uses}: the {describe_op(ref_node)} is left out",
            primary=ctx.rank_site(at, "the value used in the operation's place"),
            reference=ctx.ref_site(ref_node, "the reference applies the operation here"),
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{at.id}"],
            expected=ctx.ref_value_name(ref_node.id),
            found=what,
            suggestion=f"apply {operation} first, as the reference does",
        )
    return None
