"""Where a rank's value strays from the reference's when no detector names a line: the line that
made the stray value, not the first line that reads it.

The fallback of the localizer (diagnose.py) reports the first rank value that reads what is
related to the broken reference value's inputs and is related to nothing itself: where the
rank's computation and the reference's part. That is where a wrong value is *used*; two facts
of the relations say where it was *made*:

- The reference computes `f(a)` and the rank computes no counterpart, but the rank does compute
  `f(b)` (the same operation, the same function), related to nothing, from values each related to
  a reference value (`b` is the reference's logits where `a` is the shifted logits): the rank
  applies the reference's operation to another operand, and that application is the line to
  change. Only when exactly one rank operation fits: two candidates name no line.
- The rank's departing operation reads, where the reference's operation of its kind reads the
  broken value, a value related to one the broken value is cut from (the reference takes the
  even columns of a fused projection, `gu[..., ::2]`, and the rank a contiguous half of its
  shard, `gu.chunk(2)[0]`): the two cut one value differently, so the rank's cut is the line.
"""

from __future__ import annotations

from ..graph.model import Node
from .context import INDEX_MAPS, Context
from .wording import _fn


def misapplied(ctx: Context, ref_node: Node, rank: int) -> Node | None:
    """The rank's one operation of `ref_node`'s kind and function that is related to nothing while
    every value it reads is related to a reference value, and at least one of them not to the
    value `ref_node` reads there; None when there is none or more than one."""
    found: list[Node] = []
    for node in ctx.ev.ranks[rank].nodes:
        if node.op != ref_node.op or _fn(node) != _fn(ref_node) or len(node.inputs) != len(ref_node.inputs):
            continue
        if not node.inputs or ctx.is_related(rank, node.id):
            continue
        if not all(ctx.is_related(rank, value) for value in node.inputs):
            continue
        reads_otherwise = any(
            not ctx.relations_between(ref_value, rank, value)
            for ref_value, value in zip(ref_node.inputs, node.inputs, strict=True)
        )
        if reads_otherwise:
            found.append(node)
    return found[0] if len(found) == 1 else None


def cut_otherwise(ctx: Context, ref_node: Node, rank: int, departure: Node) -> Node | None:
    """The rank's cut that `departure` reads where the reference's operation of its kind reads
    `ref_node` (or a value cut from it), when the rank's cut is related to a value `ref_node` is
    cut from: the two programs cut one value differently. None when no such cut is read."""
    sources = _cut_from(ctx, ref_node)
    if not sources:
        return None
    pieces = _cut_into(ctx, ref_node)
    for consumer in {c.id: c for piece in pieces for c in ctx.consumers_in_reference(piece)}.values():
        if consumer.op != departure.op or _fn(consumer) != _fn(departure) or consumer.id in pieces:
            continue
        for position, value in enumerate(consumer.inputs):
            if value not in pieces or position >= len(departure.inputs):
                continue
            read = departure.inputs[position]
            made = ctx.rank_node(rank, read)
            if made is None or made.op not in INDEX_MAPS:
                continue
            related_to = {ref for _, refs in ctx.index.relations_of_rank_value(rank, read) for ref in refs}
            if related_to & sources:
                return made
    return None


def _cut_into(ctx: Context, ref_node: Node) -> set[str]:
    """`ref_node` and the reference values cut from it by cuts alone (its rows picked by a slice)."""
    pieces = {ref_node.id}
    for node in ctx.reference.nodes:
        if node.op in INDEX_MAPS and node.inputs and node.inputs[0] in pieces:
            pieces.add(node.id)
    return pieces


def _cut_from(ctx: Context, ref_node: Node) -> set[str]:
    """The reference values `ref_node` is cut from by cuts alone (its inputs, theirs, ...), when
    `ref_node` is itself a cut."""
    sources: set[str] = set()
    frontier = [ref_node] if ref_node.op in INDEX_MAPS else []
    while frontier:
        node = frontier.pop()
        for value in node.inputs[:1]:  # a cut's data is its first input
            if value in sources:
                continue
            sources.add(value)
            producer = ctx.ref_nodes.get(value)
            if producer is not None and producer.op in INDEX_MAPS:
                frontier.append(producer)
    return sources
