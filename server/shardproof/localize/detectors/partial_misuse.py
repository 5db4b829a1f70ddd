"""A partial sum (or partial max) used before it is reduced: missing-reduction,
partial-sum-into-nonlinear, bias-before-reduction, wrong-scaling (a share of a bias with the wrong
fraction), duplicate-reduction (one of two partial sums reduced early), wrong-layout (partial sums
rearranged before their reduction). Reads the partial-sum relations of the broken value's inputs
and their consumers on the rank."""

from __future__ import annotations

from fractions import Fraction

from ...graph.model import Node
from ...results import Discrepancy, Site
from ...verify.relations_found import Relation
from ..context import Context
from ..sites import line_of
from ..wording import describe_op
from .reduction_coverage import reduction_coverage


def partial_misuse(ctx: Context, ref_node: Node, rank: int) -> Discrepancy | None:
    for position, value in enumerate(ref_node.inputs):
        relations = ctx.index.relations(value, rank)
        if not relations or any(rel.kind not in ("psum", "pmax") for rel, _ in relations):
            continue
        partials = [(rel, v) for rel, values in relations for v in values]
        consumers = [
            (rel, v, ctx.rank_nodes[rank][c]) for rel, v in partials for c in ctx.rank_consumers[rank].get(v, [])
        ]
        if not consumers:
            continue
        reductions = [item for item in consumers if item[2].op == "all_reduce"]
        if reductions:
            return reduction_coverage(ctx, ref_node, value, rank, reductions[0][2])
        # Where the partial sum leaks: a consumer whose own output is not again a partial sum
        # of the same value (masking a lookup keeps it partial; a wrong regrouping does not).
        still_partial = {v for _, v in partials}
        leaks = [item for item in consumers if item[2].id not in still_partial]
        consumers = leaks or consumers
        aligned = ctx.aligned(ref_node, rank)
        rel, partial_value, consumer = next(
            (item for item in consumers if aligned is not None and item[2].id == aligned.id), consumers[0]
        )
        return _partial_consumed(ctx, ref_node, value, position, rank, rel, partial_value, consumer)
    return None


def _computed_at(ctx: Context, rank: int, producer: Node | None, kind: str) -> Node | None:
    """Where a partial value is computed: back through the views and permutes that only reshape it
    (a partial max unsqueezed for its use is still the max's: the all-reduce belongs after the
    max, `partial-max-viewed` relates both)."""
    while producer is not None and producer.op in ("view", "permute") and len(producer.inputs) == 1:
        source = ctx.rank_node(rank, producer.inputs[0])
        if source is None or not any(rel.kind == kind for rel, _ in ctx.index.relations_of_rank_value(rank, source.id)):
            break
        producer = source
    return producer


def _partial_consumed(
    ctx: Context,
    ref_node: Node,
    ref_value: str,
    position: int,
    rank: int,
    rel: Relation,
    partial_value: str,
    consumer: Node,
) -> Discrepancy:
    producer = _computed_at(ctx, rank, ctx.rank_node(rank, partial_value), rel.kind)
    reduced = "input features" if producer is not None and producer.op == "linear" else "reduced indices"
    partial = "partial max" if rel.kind == "pmax" else "partial sum"
    holds = (
        f"rank {rank} holds a {partial} over its {reduced} [{rel.start}:{rel.end}] of {rel.total}"
        if rel.total
        else f"rank {rank} holds a {partial}"
    )
    ref_input = ctx.ref_nodes.get(ref_value)
    other_values = [v for v in consumer.inputs if v != partial_value]
    reference_site = ctx.ref_site(ref_node, "the reference uses the full value here")
    if consumer.op == "binary" and consumer.attrs.get("fn") in ("add", "sub") and other_values:
        other = other_values[0]
        share = _share_of(ctx, rank, other, ref_node)
        if share is not None:
            num, den, share_node = share
            width = rel.end - rel.start
            if width * den != rel.total * num:
                counted = _fraction(Fraction(num * rel.total, den * width)) if width else "?"
                return Discrepancy(
                    kind="wrong-scaling",
                    message=f"this rank adds {num}/{den} of {ctx.ref_value_name(share_node)} to a partial sum "
                    f"over {width}/{rel.total} of the reduction; after the all-reduce it counts "
                    f"{counted} times instead of once",
                    primary=_share_site(ctx, rank, other),
                    reference=reference_site,
                    related=[s for s in [ctx.rank_site(consumer, "where the share joins the partial sum")] if s],
                    reference_node=ref_node.id,
                    parallel_nodes=[f"rank{rank}/{consumer.id}"],
                    expected=f"a {width}/{rel.total} share of the bias on each rank",
                    found=f"a {num}/{den} share",
                    suggestion=f"scale the share by {width}/{rel.total} exactly once",
                )
        parameter = ctx.is_parameter_value(rank, other)
        reduction = ctx.downstream_all_reduce(rank, consumer.id)
        early = _reduced_through_movement(ctx, rank, other)
        if early is not None and reduction is not None:
            # Two partial sums meant to be reduced together: one was reduced on its own first,
            # so the later all-reduce counts it world-size times.
            return Discrepancy(
                kind="duplicate-reduction",
                message=f"this all-reduce completes a partial sum that is then added to another partial sum "
                f"and all-reduced again with it, so it counts {_group_size(ctx, reduction)} times",
                # a reduction helper's own line is shared with the later all-reduce: its caller
                primary=ctx.rank_site(
                    early, innocent={line_of(f) for f in reduction.site.frames} if reduction.site else None
                ),
                reference=reference_site,
                related=[
                    s
                    for s in [
                        ctx.rank_site(consumer, "where the reduced value joins the partial sum"),
                        ctx.rank_site(reduction, "the all-reduce that reduces it again"),
                    ]
                    if s
                ],
                reference_node=ref_node.id,
                parallel_nodes=[f"rank{rank}/{early.id}", f"rank{rank}/{consumer.id}"],
                expected="both partial sums added first and all-reduced once",
                found=f"{holds}, plus a value all-reduced already",
                suggestion="remove this all-reduce: the sum it joins is all-reduced afterwards",
            )
        # a value every rank holds in full (a parameter, a constant, a replicated activation)
        added = parameter or _full_value(ctx, rank, other)
        if added is not None and reduction is not None:
            return Discrepancy(
                kind="bias-before-reduction",
                message=f"{added} is added to a partial sum on every rank before the all-reduce, so it "
                f"is counted {_group_size(ctx, reduction)} times",
                primary=ctx.rank_site(consumer),
                reference=reference_site,
                related=[s for s in [ctx.rank_site(reduction, "the all-reduce that sums the biases")] if s],
                reference_node=ref_node.id,
                parallel_nodes=[f"rank{rank}/{consumer.id}"],
                expected=f"{added} added once, after the all-reduce",
                found=f"{holds}, plus the full {added} on every rank",
                suggestion=f"add {added} after the all-reduce (or add 1/world_size of it on every rank)",
                details=ctx._fix("move-out", f"Add {added} after the all-reduce"),
            )
    movement = consumer.op in ("view", "permute", "slice", "cat", "expand")
    reduction = ctx.downstream_all_reduce(rank, consumer.id, kinds=("all_reduce", "reduce_scatter"))
    if movement and reduction is not None:
        # The partial sums do reach a reduction, but rearranged on the way in a layout the
        # reference's value does not have (chunks regrouped wrongly before a reduce-scatter).
        where = ctx.rank_site(consumer).short() if consumer.site else "?"
        return Discrepancy(
            kind="wrong-layout",
            message=f"the partial sums are rearranged by the {describe_op(consumer)} at {where} before the "
            f"{describe_op(reduction)}, into a layout that does not match the reference's value",
            primary=ctx.rank_site(consumer),
            reference=reference_site,
            related=[s for s in [ctx.rank_site(reduction, "the reduction it feeds")] if s],
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{partial_value}", f"rank{rank}/{consumer.id}"],
            expected=f"{ctx.ref_value_name(ref_value)} in the layout the reduction splits or sums",
            found=holds,
            suggestion="rearrange the partial sums so that the reduction's chunks are the ranks' slices",
        )
    kind = "missing-reduction" if consumer.op in ("binary",) or rel.kind == "pmax" else "partial-sum-into-nonlinear"
    producer_site = ctx.rank_site(producer, f"the {partial} is produced here") if producer else None
    later = _reduction_after(ctx, rank, consumer.id) if kind == "partial-sum-into-nonlinear" else None
    if later is not None:
        # The reduction exists, after an operation that needs the full value: that operation's
        # line is what to change (reduce first, then apply it).
        return _applied_before_reduction(
            ctx, ref_node, ref_value, rank, rel, partial, holds, partial_value, consumer, later, producer_site
        )
    what = ctx.ref_value_name(ref_value) if ref_input is not None else ref_value
    consumer_desc = describe_op(consumer)
    source = describe_op(producer) if producer is not None else "partial computation"
    consumer_where = ctx.rank_site(consumer).short() if consumer.site else "?"
    reduce_op = " (max)" if rel.kind == "pmax" else ""
    message = (
        f"the {partial} of the {source} reaches the {consumer_desc} at {consumer_where} "
        f"without an all-reduce{reduce_op}"
    )
    related = [
        s
        for s in [
            ctx.rank_site(consumer, f"the {partial} is used by {consumer_desc} here"),
            ctx.ref_site(ref_input, "the reference produces the full value here") if ref_input is not None else None,
        ]
        if s
    ]
    primary = producer_site or ctx.rank_site(consumer)
    unused = _unused_reduction(ctx, rank, rel.kind)
    unused_site = ctx.rank_site(unused, "this reduction's result is never used") if unused is not None else None
    if unused is not None and unused_site is not None:
        # The rank does reduce, but a value whose reduced result nothing reads (an in-place
        # all-reduce of another tensor, or of this one after it was used): that call is the one to
        # change, to reduce the partial value instead.
        unused_where = f"the {describe_op(unused)} at {unused_site.short()}"
        message = f"{unused_where} reduces a value nothing reads afterwards; {message}"
        related = [s for s in [producer_site, *related] if s]
        primary = unused_site
    return Discrepancy(
        kind=kind,
        message=message,
        primary=primary,
        reference=reference_site,
        related=related,
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{partial_value}", f"rank{rank}/{consumer.id}"],
        expected=f"{what} in full on every rank (replicated), as input {position} of the {describe_op(ref_node)}",
        found=holds,
        suggestion=(
            "all-reduce the partial maxes (op=MAX over the tensor-parallel group) before using them"
            if rel.kind == "pmax"
            else "all-reduce the partial sums (sum over the tensor-parallel group) before using them"
        ),
        details={
            # the quick fix wraps the primary's expression: not a misplaced reduction's call
            **(ctx._fix("wrap", "Insert the missing all-reduce") if primary is not unused_site else {}),
            "holdings": ctx._holdings(ref_value),
            "culprit": f"rank{rank}/{partial_value}",
        },
    )


def _unused_reduction(ctx: Context, rank: int, kind: str) -> Node | None:
    """A reduction of the rank (sum, or max for a partial max) whose result no operation reads and
    the program does not return: communication without effect, the last such in program order."""
    wanted = "max" if kind == "pmax" else "sum"
    outputs = set(ctx.ev.ranks[rank].outputs)
    unused = [
        node
        for node in ctx.ev.ranks[rank].nodes
        if node.op in ("all_reduce", "reduce_scatter")
        and node.collective is not None
        and (node.collective.reduce_op or "sum") == wanted
        and not ctx.rank_consumers[rank].get(node.id)
        and node.id not in outputs
    ]
    return unused[-1] if unused else None


# operations that start a new partial computation: an all-reduce past one reduces that, not this
_NEW_PARTIALS = ("linear", "matmul", "embedding", "sdpa", "all_gather", "reduce_scatter", "all_to_all")


def _reduction_after(ctx: Context, rank: int, value: str, depth: int = 12) -> Node | None:
    """The first all-reduce (sum) that `value` flows into through elementwise operations, views
    and reductions (a norm written out), before any operation that makes a new partial value."""
    frontier, seen = [value], {value}
    for _ in range(depth):
        following = []
        for v in frontier:
            for consumer_id in ctx.rank_consumers[rank].get(v, []):
                consumer = ctx.rank_nodes[rank][consumer_id]
                coll = consumer.collective
                if consumer.op == "all_reduce" and coll is not None and (coll.reduce_op or "sum") == "sum":
                    return consumer
                if consumer_id not in seen and consumer.op not in _NEW_PARTIALS:
                    seen.add(consumer_id)
                    following.append(consumer_id)
        frontier = following
    return None


def _applied_before_reduction(
    ctx: Context,
    ref_node: Node,
    ref_value: str,
    rank: int,
    rel: Relation,
    partial: str,
    holds: str,
    partial_value: str,
    consumer: Node,
    reduction: Node,
    producer_site: Site | None,
) -> Discrepancy:
    # the module it runs in names a written-out op (`pow by 2` of an RMSNorm)
    inside = f" (in `{consumer.module_path}`)" if consumer.module_path else ""
    consumer_desc = describe_op(consumer) + inside
    reduction_where = ctx.rank_site(reduction).short() if reduction.site else "?"
    return Discrepancy(
        kind="partial-sum-into-nonlinear",
        message=f"the {consumer_desc} is applied to the {partial} of {ctx.ref_value_name(ref_value)} before the "
        f"all-reduce at {reduction_where}; it needs the full value",
        primary=ctx.rank_site(consumer, f"{consumer_desc} of a {partial}"),
        reference=ctx.ref_site(ref_node, "the reference applies it to the full value here"),
        related=[s for s in [ctx.rank_site(reduction, "the all-reduce, after it"), producer_site] if s is not None],
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{partial_value}", f"rank{rank}/{consumer.id}", f"rank{rank}/{reduction.id}"],
        expected=f"the {consumer_desc} of {ctx.ref_value_name(ref_value)} in full (reduced first)",
        found=f"{holds}, and the {consumer_desc} is applied to it before the all-reduce",
        suggestion=f"all-reduce first, then apply the {consumer_desc} (move the all-reduce before this line)",
        details={"holdings": ctx._holdings(ref_value)},
    )


def _reduced_through_movement(ctx: Context, rank: int, value: str, depth: int = 6) -> Node | None:
    """The all-reduce (sum) that `value` is, through views and permutes, if any."""
    for _ in range(depth):
        node = ctx.rank_node(rank, value)
        if node is None:
            return None
        if node.op == "all_reduce":
            coll = node.collective
            return node if coll is None or (coll.reduce_op or "sum") == "sum" else None
        if node.op not in ("view", "permute") or not node.inputs:
            return None
        value = node.inputs[0]
    return None


def _share_of(ctx: Context, rank: int, value: str, ref_node: Node) -> tuple[int, int, str] | None:
    """(num, den, reference value) when a rank value is num/den of a reference value."""
    c = ctx.index.class_of(f"rank{rank}", value)
    for ref_value in ref_node.inputs:
        for rel, values in ctx.index.relations(ref_value, rank):
            if rel.kind == "frac" and value in values:
                return rel.num, rel.den, ref_value
    del c
    return None


def _share_site(ctx: Context, rank: int, value: str) -> Site | None:
    node = ctx.rank_node(rank, value)
    if node is not None:
        return ctx.rank_site(node, "the share is computed here")
    return ctx.provenance_site(rank, value)


def _group_size(ctx: Context, reduction: Node) -> int:
    """How many ranks' values an all-reduce adds: its group's (the whole world without one)."""
    group = reduction.collective.group if reduction.collective else ()
    return len(group) if group else len(ctx.ev.ranks)


def _fraction(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _full_value(ctx: Context, rank: int, value: str) -> str | None:
    """How to name a value that is not a parameter and that the rank holds in full: a constant it
    makes, or a value equal to the reference's."""
    if ctx._is_constant_like(rank, value):
        return "a constant"
    c = ctx.index.class_of(f"rank{rank}", value)
    same = sorted(ctx.index.reference_values(c)) if c is not None else []
    return ctx.ref_value_name(same[0]) if same else None
