"""scaled-gradient: a gradient that is the reference's times a constant (a loss averaged with the
wrong count, gradients summed where they should be averaged). Reads the constant factors the
encoder carried outside the joint graphs' values."""

from __future__ import annotations

from fractions import Fraction

from ...graph.model import Graph, Node
from ...results import Discrepancy
from ...verify.factored_terms import SCALED_SUFFIX
from ..context import Context


def scaled_gradient(ctx: Context, failing_outputs: list[int]) -> Discrepancy | None:
    """A gradient that is the reference's times a constant: the unscaled values agree, the
    factors carried outside them do not. The loss a rank seeds backward with is checked first:
    a data-parallel rank's loss over its items should carry the reference's factor times the
    number of ranks its gradients are averaged over (a local mean, averaged by the all-reduce).
    A seed off by another factor (micro-batch means summed instead of divided by their number or
    by the step's item count) is the mistake; otherwise the gradients' reduction is (summed
    where they should be averaged, or divided twice)."""
    for index in failing_outputs:
        parameter = ctx._gradient_of(index)
        if parameter is None:
            continue
        ref_value = ctx.reference.outputs[index]
        ref_class = _unscaled_class(ctx, "reference", ref_value)
        for rank, graph in enumerate(ctx.ev.ranks):
            if index >= len(graph.outputs):
                continue
            value = graph.outputs[index]
            own = _unscaled_class(ctx, graph.name, value)
            if own is None or own != ref_class:
                continue
            ratio = ctx.factor(graph.name, value) / ctx.factor("reference", ref_value)
            if ratio == 1:
                continue
            return _scaled_gradient_report(ctx, index, parameter, rank, value, ratio)
    return None


def _unscaled_class(ctx: Context, graph: str, value: str) -> int | None:
    """The e-class of the value without the factor carried outside it (the value's, if none)."""
    unscaled = ctx.index.class_of(graph, value + SCALED_SUFFIX)
    return unscaled if unscaled is not None else ctx.index.class_of(graph, value)


def _scaled_gradient_report(
    ctx: Context, index: int, parameter: str, rank: int, value: str, ratio: Fraction
) -> Discrepancy:
    graph = ctx.ev.ranks[rank]
    nodes = ctx.rank_nodes[rank]
    reduction = _reduction_upstream(ctx, rank, value)
    averaged_over = len(reduction.collective.group) if reduction is not None and reduction.collective else 1
    reference_seed = next(iter(_seed_losses(ctx.reference, ctx.ref_nodes)), None)
    expected_seed = ctx.factor("reference", reference_seed) * averaged_over if reference_seed is not None else None
    wrong_seed = next(
        (
            seed
            for seed in _seed_losses(graph, nodes)
            if expected_seed is not None and ctx.factor(graph.name, seed) != expected_seed
        ),
        None,
    )
    times = str(ratio)  # "2", "1/2"
    base = f"rank {rank}'s gradient of `{parameter}` is {times} × the reference's"
    if wrong_seed is not None:
        by = str(ctx.factor(graph.name, wrong_seed) / expected_seed)  # type: ignore[operator]
        primary = ctx.rank_site(nodes[wrong_seed], "the loss backward starts from") if wrong_seed in nodes else None
        cause = (
            f"the loss it runs backward from is {by} × what averaging over its items needs "
            "(per-micro-batch means added up instead of the total divided by the number of items)"
        )
        suggestion = (
            "divide each micro-batch's summed loss by the number of items in the whole step "
            "(or its mean by the number of micro-batches)"
        )
    else:
        primary = ctx.rank_site(reduction, "the gradients are reduced here") if reduction is not None else None
        cause = "the ranks' gradients are combined with the wrong scale (summed where they should be averaged)"
        suggestion = "average the gradients over the data-parallel ranks (divide the all-reduced sum by their number)"
    ref_node = ctx.ref_nodes.get(ctx.reference.outputs[index])
    return Discrepancy(
        kind="scaled-gradient",
        message=f"{base}: {cause}",
        primary=primary,
        reference=ctx.ref_site(ref_node) if ref_node is not None else None,
        ranks=list(range(len(ctx.ev.ranks))),
        reference_node=ctx.reference.outputs[index],
        parallel_nodes=[f"{graph.name}/{value}"],
        expected=f"the gradient of `{parameter}` as the reference computes it",
        found=f"{times} × that gradient",
        suggestion=suggestion,
    )


def _reduction_upstream(ctx: Context, rank: int, value: str, depth: int = 12) -> Node | None:
    """The all-reduce a gradient output comes from through views, transposes and scalings."""
    nodes = ctx.rank_nodes[rank]
    node = nodes.get(value)
    for _ in range(depth):
        if node is None:
            return None
        if node.op == "all_reduce":
            return node
        if node.op not in ("view", "permute", "scalar") or not node.inputs:
            return None
        node = nodes.get(node.inputs[0])
    return None


def _seed_losses(graph: Graph, nodes: dict[str, Node]) -> list[str]:
    """The losses a program runs backward from (what its `ones_like` seeds are shaped like)."""
    return [
        n.attrs["like"]
        for n in graph.nodes
        if n.op == "constant" and n.original.endswith("ones_like") and n.attrs.get("like") in nodes
    ]
