"""missing-gradient: a rank computes no gradient for a parameter the reference trains (a detach
on the path, a frozen or unused parameter). Reads the gradient roles and cuts of the joint graphs."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context
from ..sites import pick_frame, to_site


def missing_gradient(ctx: Context, failing_outputs: list[int]) -> Discrepancy | None:
    """A rank that computes no gradient at all for a parameter the reference trains: its
    forward detaches the path (reported at the detach), or the parameter is frozen or unused
    on the rank (reported at the parameter's use)."""
    for index in failing_outputs:
        parameter = ctx._gradient_of(index)
        if parameter is None:
            continue
        ranks = [
            r
            for r, graph in enumerate(ctx.ev.ranks)
            if index < len(graph.gradient_roles) and (role := graph.gradient_roles[index]) is not None and role.absent
        ]
        if not ranks:
            continue
        graph = ctx.ev.ranks[ranks[0]]
        role = graph.gradient_roles[index]
        assert role is not None
        cuts = graph.gradient_cuts
        if cuts:
            primary = to_site(pick_frame(cuts[-1], ctx.ref_lines), "the gradient stops here")
            cause = "its forward detaches the value the gradient flows through"
        else:
            use = _first_use(ctx, ranks[0], role.rank_parameter or parameter)
            primary = ctx.rank_site(use, "the parameter is used here") if use else None
            cause = "the parameter is frozen or takes no part in the loss on the rank"
        return Discrepancy(
            kind="missing-gradient",
            message=f"rank {ranks[0]} computes no gradient for `{role.rank_parameter}` "
            f"(the reference trains `{parameter}`): {cause}",
            primary=primary,
            reference=None,
            ranks=ranks,
            reference_node=ctx.reference.outputs[index],
            expected=f"the gradient of `{parameter}` (or its block) on every rank",
            found="no gradient (zeros)",
            suggestion="let the gradient flow: remove the detach / no_grad on this path, or train the parameter",
        )
    return None


def _first_use(ctx: Context, rank: int, parameter: str) -> Node | None:
    graph = ctx.ev.ranks[rank]
    placeholder = next((p.id for p in graph.placeholders if p.target == parameter), None)
    if placeholder is None:
        return None
    return next((n for n in graph.nodes if placeholder in n.inputs), None)
