"""wrong-layout (a buffer unpacked at the wrong offset): values concatenated into one buffer,
reduced by one collective, and taken back out by a slice that straddles two of the pieces.

A coalesced all-reduce (DeepSpeed's and Megatron's gradient buckets, fused reductions of several
outputs) flattens values into one buffer, all-reduces it once and slices each value back out. An
all-reduce is elementwise over the ranks, so the reduced buffer has the pieces of the
concatenation at the same offsets: piece k is [b_k : b_(k+1)) along the concatenated dim. A slice
whose length is a piece's but whose bounds are not that piece's mixes the end of one value with
the start of the next, whatever the values are: the slice is the line to change. Reads the rank
graphs only (slice bounds, the sizes of the concatenated pieces); runs after the program has
been shown to differ, so a slice across pieces on purpose elsewhere is never reported for a
program that is right."""

from __future__ import annotations

from ...graph.model import Node
from ...results import Discrepancy
from ..context import Context
from ..wording import describe_op

_ELEMENTWISE_REDUCTIONS = ("all_reduce",)


def unpacked_buffer(ctx: Context, failing_outputs: list[int]) -> Discrepancy | None:
    found = [d for rank in range(len(ctx.ev.ranks)) if (d := _first_straddle(ctx, rank)) is not None]
    if not found:
        return None
    first = found[0]
    assert first.primary is not None
    first.ranks = [d.ranks[0] for d in found if d.primary is not None and d.primary.line == first.primary.line]
    return first


def _first_straddle(ctx: Context, rank: int) -> Discrepancy | None:
    nodes = ctx.rank_nodes[rank]
    for node in ctx.ev.ranks[rank].nodes:
        if node.op != "slice" or node.attrs.get("step", 1) not in (1, None):
            continue
        reduction = nodes.get(node.inputs[0])
        if reduction is None or reduction.op not in _ELEMENTWISE_REDUCTIONS or reduction.meta is None:
            continue
        cat = nodes.get(reduction.inputs[0])
        if cat is None or cat.op != "cat" or node.meta is None:
            continue
        found = _straddled(ctx, rank, node, reduction, cat)
        if found is not None:
            return found
    return None


def _straddled(ctx: Context, rank: int, node: Node, reduction: Node, cat: Node) -> Discrepancy | None:
    ndim = len(reduction.meta.shape)
    dim, cat_dim = node.attrs.get("dim", 0) % ndim, cat.attrs.get("dim", 0) % ndim
    if dim != cat_dim:
        return None
    sizes = []
    for value in cat.inputs:
        try:
            meta = ctx.ev.ranks[rank].meta_of(value)
        except KeyError:
            return None
        if meta is None or len(meta.shape) != ndim:
            return None
        sizes.append(meta.shape[dim])
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    total = bounds[-1]
    start, end = _bound(node.attrs.get("start"), total, 0), _bound(node.attrs.get("end"), total, total)
    if start is None or end is None or (start in bounds and end in bounds):
        return None  # whole pieces
    length = end - start
    # the piece of that length the slice overlaps most: the one it was meant to take
    candidates = [(min(end, bounds[k + 1]) - max(start, bounds[k]), k) for k in range(len(sizes)) if sizes[k] == length]
    candidates = [(overlap, k) for overlap, k in candidates if overlap > 0]
    if not candidates:
        return None
    _, k = max(candidates)
    piece = ctx.rank_nodes[rank].get(cat.inputs[k])
    site = ctx.rank_site(node)
    if site is None:
        return None
    shown = f"[{start}:{end}]"
    meant = f"[{bounds[k]}:{bounds[k + 1]}]"
    return Discrepancy(
        kind="wrong-layout",
        message=f"the slice {shown} of the {describe_op(reduction)} buffer straddles two of the "
        f"{len(sizes)} values concatenated into it (at offsets {', '.join(map(str, bounds[:-1]))}): it "
        f"mixes the end of one with the start of the next; the value of that length is at {meant}",
        primary=site,
        related=[
            s
            for s in [
                ctx.rank_site(reduction, "the buffer is reduced here"),
                ctx.rank_site(cat, "the values are concatenated here"),
                ctx.rank_site(piece, "the value of that length is made here") if piece is not None else None,
            ]
            if s is not None
        ],
        parallel_nodes=[f"rank{rank}/{node.id}", f"rank{rank}/{cat.id}"],
        expected=f"the slice {meant} along dim {dim} (piece {k + 1} of {len(sizes)})",
        found=f"the slice {shown}",
        suggestion=f"slice the reduced buffer at {meant}, the offsets at which the values were concatenated",
        ranks=[rank],
    )


def _bound(value: object, total: int, default: int) -> int | None:
    if value is None:
        return default
    if not isinstance(value, int):
        return None
    value = value + total if value < 0 else value
    return max(0, min(value, total))
