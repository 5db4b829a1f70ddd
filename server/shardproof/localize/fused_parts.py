"""A fused value cut as one block: the reference splits a value into parts along a dim (a fused
[gate; up] or [q; k; v] projection's output split into gate and up, or q, k and v), and the rank
splits its counterpart into as many parts, but holds one contiguous block of the fused dim instead
of its block of every part.

Column parallelism of a fused projection gives rank r, of each of the k parts, the part's block r;
its k local parts are then the blocks of the reference's k parts. One contiguous block of the
whole fused dim (rank 0 all of gate, the last rank all of up) makes the rank's k local parts
pieces of one or two reference parts, whatever split sizes the rank uses. The split is right for
the layout every other line assumes; the line to change is the one that cut the block (a weight
loader, an in-place assignment on the reference module, a builder), found by walking back from
the split's input (`Blame.blame`). Every parameter cut into that block (a weight and its bias cut
by one loop) is cut wrong, so none of their cuts makes its line innocent."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..graph.model import Node
from ..relations import expr as px
from .blame import blocked_tiling
from .context import Context


@dataclass(frozen=True)
class OneBlockOfParts:
    dim: int  # the fused dim (non-negative)
    block: tuple[int, int]  # the rank's one block of it
    parts: tuple[tuple[int, int], ...]  # the reference's parts of it, in order


def one_block_of_parts(ctx: Context, ref_node: Node, aligned: Node, rank: int, value: str) -> OneBlockOfParts | None:
    """Whether `ref_node` splits a value into parts along a dim (one of several slices of it, or a
    view factoring the dim into a leading count of parts) that the rank's `aligned` splits into as
    many parts, while `value` (its input on the rank) is one contiguous block of that dim."""
    if ref_node.op != aligned.op or not ref_node.inputs:
        return None
    fused = ref_node.inputs[0]
    shape = ctx._shape(fused)
    if not shape:
        return None
    split = _split(ctx, ref_node, shape)
    if split is None:
        return None
    dim, parts = split
    blocks = _blocks_along(ctx, fused, rank, value, dim, len(shape))
    if not blocks or blocks[0] == (0, shape[dim]):
        return None
    if _rank_part_count(ctx, aligned, rank, value, dim, len(shape)) != len(parts):
        return None  # the rank does not split its block into the reference's parts
    return OneBlockOfParts(dim, blocks[0], tuple(parts))


def whole_count_on_block(ctx: Context, ref_node: Node, aligned: Node, rank: int, value: str) -> int | None:
    """The count of parts the rank's block holds, when the rank's `aligned` view factors `value`,
    one contiguous block of whole parts of the reference's value, into as many parts as the
    reference's view makes of the whole value (heads viewed with the model's head count where the
    rank's block holds its share of the heads): the view's count is what is wrong."""
    if ref_node.op != "view" or aligned.op != "view" or not ref_node.inputs:
        return None
    fused = ref_node.inputs[0]
    shape = ctx._shape(fused)
    factored = _leading_factor(tuple(shape), tuple(ref_node.attrs.get("shape", ()))) if shape else None
    if factored is None:
        return None
    dim, count = factored
    try:
        local = tuple(ctx.ev.ranks[rank].meta_of(value).shape)
    except KeyError:
        return None
    viewed = tuple(aligned.attrs.get("shape", ()))
    # the rank's view keeps the dims before `dim` and starts it with `count` parts (of one element
    # each, when its block holds as many elements as the reference has parts)
    if len(viewed) <= dim or viewed[:dim] != local[:dim] or viewed[dim] != count:
        return None
    if math.prod(viewed[dim:]) != math.prod(local[dim:]):
        return None
    part = shape[dim] // count
    for start, end in _blocks_along(ctx, fused, rank, value, dim, len(shape)):
        if end - start < shape[dim] and start % part == 0 and (end - start) % part == 0:
            return (end - start) // part
    return None


def _blocks_along(ctx: Context, fused: str, rank: int, value: str, dim: int, ndim: int) -> list[tuple[int, int]]:
    """The one-range blocks of `fused` along `dim` (non-negative) that the rank's `value` holds."""
    return [
        rel.ranges[0]
        for rel in ctx.relations_between(fused, rank, value)
        if rel.kind == "sel" and len(rel.ranges) == 1 and rel.dim % ndim == dim
    ]


def _split(ctx: Context, ref_node: Node, shape: tuple[int, ...]) -> tuple[int, list[tuple[int, int]]] | None:
    """The dim the reference splits its value along and the parts, in order: the slices of the
    value along the dim of `ref_node` when they tile it, or the equal parts of a view's leading
    factor of the first dim it factors (a [b, s, 3 * heads * d] value viewed as [b, s, 3, heads, d])."""
    if ref_node.op == "slice":
        dim = _dim(ref_node, len(shape))
        if dim is None:
            return None
        parts = _slices_along(ctx.reference.nodes, ref_node.inputs[0], dim, len(shape))
        return (dim, parts) if len(parts) >= 2 and blocked_tiling(parts, shape[dim]) else None
    if ref_node.op == "view":
        viewed = tuple(ref_node.attrs.get("shape", ()))
        factored = _leading_factor(shape, viewed)
        # parts of several dims each ([b, s, 3, heads, d]: q, k and v), or parts the reference
        # takes apart; a factor carried whole over one dim each is a count of like parts (heads)
        if factored is None or not (len(viewed) - len(shape) >= 2 or _parts_taken_apart(ctx, ref_node, factored[0])):
            return None
        dim, count = factored
        size = shape[dim] // count
        return dim, [(i * size, (i + 1) * size) for i in range(count)]
    return None


def _parts_taken_apart(ctx: Context, view: Node, dim: int, depth: int = 4) -> bool:
    """Whether the reference takes the view's parts (its factor `dim`) apart: a slice along that
    dim, after any permutations (q, k and v of a [b, s, 3, heads, d] view). A factor the
    reference carries whole, one computation for every part (the heads of attention), is not a
    fused value's parts: a rank's view into that many parts holds the wrong count of them."""
    frontier = [(view.id, dim % len(view.meta.shape))]
    for _ in range(depth):
        following = []
        for value, at in frontier:
            for consumer_id in ctx.ref_consumers.get(value, []):
                consumer = ctx.ref_nodes[consumer_id]
                ndim = len(consumer.meta.shape)
                if consumer.op == "slice" and _dim(consumer, ndim) == at:
                    return True
                if consumer.op == "permute":
                    perm = [p % ndim for p in consumer.attrs.get("perm", [])]
                    if at in perm:
                        following.append((consumer.id, perm.index(at)))
        frontier = following
    return False


def _rank_part_count(ctx: Context, aligned: Node, rank: int, value: str, dim: int, ndim: int) -> int:
    """Into how many parts the rank splits its block along `dim` (its slices, or its view's factor)."""
    if aligned.op == "slice":
        if _dim(aligned, ndim) != dim:
            return 0
        consumers = [ctx.rank_nodes[rank][c] for c in ctx.rank_consumers[rank].get(value, [])]
        return len(_slices_along(consumers, value, dim, ndim))
    try:
        local = ctx.ev.ranks[rank].meta_of(value).shape
    except KeyError:
        return 0
    factored = _leading_factor(tuple(local), tuple(aligned.attrs.get("shape", ())))
    return factored[1] if factored is not None and factored[0] == dim else 0


def _leading_factor(source: tuple[int, ...], viewed: tuple[int, ...]) -> tuple[int, int] | None:
    """(dim, count) when `viewed` keeps the dims before `dim` and factors dim `dim` of `source`
    into `count` (at least 2) times the rest, over two or more dims."""
    dim = 0
    while dim < min(len(source), len(viewed)) and source[dim] == viewed[dim]:
        dim += 1
    if dim >= len(source) or dim >= len(viewed) or len(viewed) <= len(source):
        return None
    count = viewed[dim]
    if count < 2 or count >= source[dim] or source[dim] % count:
        return None
    rest, end = 1, dim + 1
    while end < len(viewed) and count * rest < source[dim]:
        rest *= viewed[end]
        end += 1
    if count * rest != source[dim] or _without_units(viewed[end:]) != _without_units(source[dim + 1 :]):
        return None
    return dim, count


def sharded_parameters(ctx: Context, rank: int, value: str, depth: int = 8) -> frozenset[str]:
    """The parameters a rank value is computed from through its sharded (not replicated) inputs:
    those whose cuts made its block (a fused projection's weight and bias)."""
    found: set[str] = set()
    frontier = [value]
    for _ in range(depth):
        following = []
        for v in frontier:
            placeholder = ctx.rank_placeholders[rank].get(v)
            if placeholder is not None and placeholder.kind in ("parameter", "buffer"):
                found.add(placeholder.target)
            node = ctx.rank_node(rank, v)
            if node is not None:
                following.extend(i for i in node.inputs if not ctx._is_replicated(rank, i))
        frontier = following
    return frozenset(found)


def cut_by_the_user(ctx: Context, rank: int, parameters: frozenset[str]) -> bool:
    """Whether a user line cut one of these parameters (a slice in its provenance made outside any
    installed library). A block no user line cut is a layout the user's code must follow: the
    same code at world size 1 sizing its own parameters, or a library's loader (Megatron's
    ColumnParallelLinear takes a contiguous block of rows and documents its per-head layout)."""
    for target in parameters:
        expr = ctx.ev.rank_values[rank].get(target)
        for made in _walk(expr) if expr is not None else []:
            frames = made.site.frames if isinstance(made, px.SliceOf) and made.site is not None else ()
            if frames and frames[-1].library is None:
                return True
    return False


def _walk(expr: px.Expr) -> list[px.Expr]:
    return [expr, *(inner for child in px.children(expr) for inner in _walk(child))]


def _slices_along(nodes: list[Node], source: str, dim: int, ndim: int) -> list[tuple[int, int]]:
    """The distinct ranges of `source` that slices of it along `dim` take, in order."""
    ranges = {
        (int(n.attrs["start"]), int(n.attrs["end"]))
        for n in nodes
        if n.op == "slice" and n.inputs and n.inputs[0] == source and _dim(n, ndim) == dim
    }
    return sorted(ranges)


def _without_units(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(size for size in shape if size != 1)


def _dim(node: Node, ndim: int) -> int | None:
    dim = node.attrs.get("dim")
    return int(dim) % ndim if isinstance(dim, int) else None
