"""wrong-shard / shard-order / wrong-layout / unrelated-parameter / not-equivalent at the rank
operation that plays the broken value's part, when its inputs are unrelated or do not fit
together; the wrong input is traced back to where it was made (blame.py). An unsupported op on
sharded inputs is reported as such. Reads the aligned rank node's input relations."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy, Unsupported
from ...verify.relations_found import ranges_text
from ..context import Context
from ..fused_parts import cut_by_the_user, one_block_of_parts, sharded_parameters, whole_count_on_block
from ..other_piece import another_piece
from ..sites import to_site
from ..wording import describe_op

# how `Blame.blame` names the line that cut a rank's block (a parameter's load, a per-rank slice)
_CUTS = ("provenance", "provenance-slice", "rank-dependent-slice")


def mismatch(ctx: Context, ref_node: Node, rank: int, depth: int = 0) -> Discrepancy | Unsupported | None:
    aligned = ctx.aligned(ref_node, rank)
    if aligned is None:
        return None
    wrong: list[tuple[int, str, str]] = []
    for k, (ref_value, value) in enumerate(zip(ref_node.inputs, aligned.inputs, strict=False)):
        if not ctx.relations_between(ref_value, rank, value):
            wrong.append((k, ref_value, value))
    if wrong and depth == 0:
        earlier = _at_the_producer(ctx, wrong[0][1], wrong[0][2], rank)
        if earlier is not None:
            return earlier
    proper_shards = False
    if not wrong:
        unsupported = ctx._unsupported(ref_node, rank)
        if unsupported is not None:
            return unsupported
        wrong, proper_shards = ctx._inconsistent_inputs(ref_node, aligned, rank)
    if not wrong:
        return None
    k, ref_value, value = wrong[0]
    # A fused value's one block split into its parts: the block is proper, yet its cut is wrong.
    one_block = one_block_of_parts(ctx, ref_node, aligned, rank, value) if proper_shards else None
    suspects = sharded_parameters(ctx, rank, value) if one_block else frozenset()
    cut = ctx.blame(rank, value, suspects=suspects) if cut_by_the_user(ctx, rank, suspects) else None
    handover = ctx.handover_frame(ctx.rank_node(rank, value), aligned) if proper_shards else None
    taken = another_piece(ctx, ref_node, aligned, rank, ref_value, value) if not proper_shards else None
    if taken is not None:
        culprit_site, how = taken.site, "another-piece"
    elif cut is not None and cut[0] is not None and cut[1] in _CUTS:
        culprit_site, how = cut[0], "one-block"
    elif (kept := ctx.kept_size_site(rank, aligned)) is not None:
        # a view shaped by a number the builder computed from this rank's share of a size (a
        # group size set to the local width): the computation is the line to change, not the view
        culprit_site, how = kept, "kept-size"
    elif proper_shards and (held := whole_count_on_block(ctx, ref_node, aligned, rank, value)) is not None:
        # the rank's block viewed into the whole value's count of parts (the model's head count
        # where the block holds its share of the heads): the view is what to change
        culprit_site, how = ctx.rank_site(aligned, "the view's count of parts"), "view-count"
    elif handover is not None:
        # A proper shard that reached an op needing another layout: it was computed right and
        # passed on unconverted (a missing gather), so the fix is where it was passed on.
        culprit_site, how = to_site(handover), "handover"
    else:
        culprit_site, how = ctx.blame(rank, value)
    if how.startswith("unsupported:") or (aligned.op == "generic" and not ctx._followed(aligned)):
        op = how.removeprefix("unsupported:") if how.startswith("unsupported:") else describe_op(aligned)
        return Unsupported(
            reason="unsupported-op",
            message=f"no rule relates {op} on rank {rank} to the reference; the check cannot follow the "
            f"parallel computation past it",
            op=op,
            site=culprit_site or ctx.rank_site(aligned),
        )
    found_rels = ctx.index.relations_of_rank_value(rank, value)
    expected = f"input {k} of the {describe_op(ref_node)} holds part of {ctx.ref_value_name(ref_value)}"
    # the values found and the one expected named together (told apart when described alike)
    *found_names, expected_name = ctx.ref_value_names(*(refs[0] for _, refs in found_rels[:2]), ref_value)
    found = (
        "; ".join(
            ctx._holding(rel, refs[0], name) for (rel, refs), name in zip(found_rels[:2], found_names, strict=True)
        )
        or "a value unrelated to anything the reference computes"
    )
    kind = "wrong-shard" if found_rels else "not-equivalent"
    if how == "provenance-cat":
        kind = "shard-order"
    if how == "unrelated-parameter":
        kind = "unrelated-parameter"
    if how == "another-piece":
        kind = "wrong-shard"  # another slice of the right values than this use needs
    if how in ("handover", "layout", "reduced-blocks", "view-count"):
        kind = "wrong-layout"
    where = ctx.rank_site(aligned).short() if aligned.site else "?"
    message = (
        f"rank {rank} applies the {describe_op(aligned)} at {where} to {found}, where the reference uses "
        f"{expected_name}"
    )
    gather = ctx.rank_node(rank, value)
    if (
        gather is not None
        and gather.op == "all_gather"
        and gather.inputs
        and ctx._is_replicated(rank, gather.inputs[0])
    ):
        # Gathering what every rank already holds in full repeats it world-size times: a
        # sequence-parallel region entered without its scatter (or one gather too many).
        message += (
            "; it is the all-gather of a value every rank already holds in full, so the value was not "
            "split (scattered) before the gather, or the gather is one too many"
        )
        how = "gather-of-whole"
    if how == "another-piece":
        assert taken is not None
        message = (
            f"rank {rank} applies the {describe_op(aligned)} at {where} to a value made from {taken.rank_piece} of "
            f"its input, where the reference takes {taken.ref_piece}"
        )
    if how == "reduced-blocks":
        message += (
            "; the all-reduce before it adds the ranks' blocks of a value (different parts of it), "
            "which are not partial sums"
        )
    if how == "view-count":
        message = (
            f"rank {rank} views its block of {ctx.ref_value_name(ref_value)} at {where} into as many parts as the "
            f"reference makes of the whole value; the block holds {held} of them"
        )
        expected = f"the rank's block viewed into its {held} parts, each the size of the reference's"
    if how == "one-block":
        assert one_block is not None
        message = (
            f"rank {rank} holds one contiguous block {ranges_text((one_block.block,))} of "
            f"{ctx.ref_value_name(ref_value)} along dim {one_block.dim}, which the reference splits into "
            f"{len(one_block.parts)} parts {ranges_text(one_block.parts)}; the rank splits its block alike at "
            f"{where}, so its parts are not blocks of the reference's parts"
        )
        expected = f"input {k} of the {describe_op(ref_node)} holds this rank's block of each of the parts"
    return Discrepancy(
        kind=kind,
        message=message,
        primary=culprit_site or ctx.rank_site(aligned),
        reference=ctx.ref_site(ref_node, f"the reference computes {describe_op(ref_node)} here"),
        related=[s for s in [ctx.rank_site(aligned, f"rank {rank} computes {describe_op(aligned)} here")] if s],
        reference_node=ref_node.id,
        parallel_nodes=[f"rank{rank}/{aligned.id}", f"rank{rank}/{value}"],
        expected=expected,
        found=found,
        suggestion=(
            "this rank's value is a proper shard, but not in the layout this operation needs: fix the line "
            "that passes it on (a missing gather, or a view in the wrong layout)"
            if how == "handover"
            else f"cut each of the {len(one_block.parts)} parts on its own: this rank takes its block of every part "
            "and joins them in the reference's order"
            if how == "one-block" and one_block is not None
            else "scatter the value before this gather (each rank keeps its slice), or drop the gather"
            if how == "gather-of-whole"
            else "join the pieces in the order the reference's layout has (each copy next to its source, "
            "as repeat_interleave does, rather than tiled copies)"
            if how == "layout"
            else "reduce partial sums, not blocks: move the all-reduce after the operation that makes the "
            "ranks' partial sums (the row-parallel linear), or gather the blocks instead"
            if how == "reduced-blocks"
            else "take the piece the reference takes (see the first location)"
            if how == "another-piece"
            else "view the block into the parts it holds (the rank's share of the count, each part the size of "
            "the reference's)"
            if how == "view-count"
            else "make this rank hold the slice its partners expect (see the first location)"
        ),
        details={"blame": how, "wrong_inputs": [w[0] for w in wrong], "culprit": f"rank{rank}/{value}"},
    )


def _at_the_producer(ctx: Context, ref_value: str, value: str, rank: int) -> Discrepancy | None:
    """An unrelated input computed by the rank's counterpart of the reference's producer from
    inputs that are each related but do not fit together (a fused projection's one-block output
    plus its per-part bias): the mismatch is there, where the pieces are combined. A value the
    rank computes piece by piece can relate in part (the piece whose layouts agree), so the
    reference's value is not the first broken one though its combination is where it breaks."""
    producer = ctx.ref_nodes.get(ref_value)
    if producer is None or len(set(producer.inputs)) < 2:
        return None  # (a combination of values: one input alone cannot fail to fit another)
    counterpart = ctx.aligned(producer, rank)
    if counterpart is None or counterpart.id != value:
        return None
    pairs = zip(producer.inputs, counterpart.inputs, strict=False)
    if not all(ctx.relations_between(ref_input, rank, input_) for ref_input, input_ in pairs):
        return None
    found = mismatch(ctx, producer, rank, depth=1)
    return found if isinstance(found, Discrepancy) else None
