"""wrong-handover: a pipeline stage sends one input of the reference's next step where the
receiver needs that step's result. Reads the point-to-point sends and their relations."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context
from ..wording import describe_op


def stage_handover(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    """A pipeline stage hands on one input of the reference's next step (a value the reference
    computes) where the receiving stage needs that step's result: a boundary that drops the
    other inputs (the residual stream). Reported at the send."""
    if ctx.ev.outputs_of is None:
        return None
    for sender, graph in enumerate(ctx.ev.ranks):
        for node in graph.nodes:
            if node.op != "p2p" or not node.attrs.get("send"):
                continue
            handed = [
                ref
                for rel, refs in ctx.index.relations_of_rank_value(sender, node.inputs[0])
                for ref in refs
                if rel.kind == "equal"
            ]
            if not any(value in ref_node.inputs for value in handed):
                continue
            others = [v for v in ref_node.inputs if v not in handed]
            if not others:
                continue
            what = ctx.ref_value_name(handed[0])
            dropped = ", ".join(ctx.ref_value_name(v) for v in others)
            receiver = node.attrs.get("peer")
            return Discrepancy(
                kind="wrong-handover",
                message=f"rank {sender} hands rank {receiver} {what}, but the reference's next step "
                f"({describe_op(ref_node)}) also needs {dropped}: the stage boundary drops it",
                primary=ctx.rank_site(node, "what this stage hands on"),
                reference=ctx.ref_site(ref_node, "the reference combines them here"),
                ranks=[sender],
                reference_node=ref_node.id,
                parallel_nodes=[f"rank{sender}/{node.id}"],
                expected=f"the {describe_op(ref_node)}'s value (or all of its inputs) sent to rank {receiver}",
                found=f"{what} alone",
                suggestion="send what the next stage needs to continue: the combined value, or every input",
            )
    return None
