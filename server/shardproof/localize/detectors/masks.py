"""Reading vocabulary masks off a rank's graph: `fill(ids - c, (ids < a) | (ids >= b))` and whether
a pick is zeroed where its targets are masked."""

from __future__ import annotations

from ...graph.model import Node
from ..context import Context


def mask_interval(
    ctx: Context, nodes: dict[str, Node], ids: Node | None, rows: tuple[int, int] | None = None
) -> tuple[tuple[int, int] | None, int | None, Node | None]:
    """For masked ids (`fill(ids - c, outside)`, `where(outside, 0, ids - c)`, `where(inside, ids -
    c, 0)`), where the mask is `(ids < a) | (ids >= b)`, `(ids >= a) & (ids < b)` or the negation
    of either: (the interval of ids kept, c, the comparison to change). With the `rows` the rank
    holds, the comparison to change is the one whose bound differs from them."""
    if ids is None or ids.op not in ("fill", "where"):
        return None, None, None
    if ids.op == "fill":
        shifted, mask, keeps = nodes.get(ids.inputs[0]), nodes.get(ids.inputs[1]), False
    else:
        kept_side = nodes.get(ids.inputs[1])
        keeps = kept_side is not None and kept_side.op == "scalar" and kept_side.attrs.get("fn") == "sub"
        mask, shifted = nodes.get(ids.inputs[0]), nodes.get(ids.inputs[1] if keeps else ids.inputs[2])
    offset = None
    if shifted is not None and shifted.op == "scalar" and shifted.attrs.get("fn") == "sub":
        offset = int(shifted.attrs["value"])
    kept, culprit = _interval(nodes, mask, keeps, rows)
    return kept, offset, culprit


def output_mask_interval(
    ctx: Context, rank: int, lookup: Node, rows: tuple[int, int] | None = None
) -> tuple[tuple[int, int] | None, int | None, Node | None]:
    """For ids shifted and clamped into the rows (`(ids - c).clamp(0, n - 1)`) whose lookup is then
    zeroed where a mask of the ids says (`out.masked_fill(outside.unsqueeze(-1), 0)`,
    `where(outside, 0, out)`, `where(inside, out, 0)`): what `mask_interval` reads of masked ids."""
    nodes = ctx.rank_nodes[rank]
    offset = _clamped_shift(nodes, nodes.get(lookup.inputs[1]))
    if offset is None:
        return None, None, None
    for _, mask, keeps in _zeroings(ctx, rank, lookup):
        while mask is not None and mask.op == "view" and mask.inputs:  # unsqueezed over the hidden dim
            mask = nodes.get(mask.inputs[0])
        kept, culprit = _interval(nodes, mask, keeps, rows)
        if kept is not None:
            return kept, offset, culprit
    return None, offset, None


def output_mask(ctx: Context, rank: int, lookup: Node) -> tuple[tuple[int, int], bool, Node] | None:
    """For a lookup zeroed after it by a mask of the ids (`fill`, `where`; unsqueezed, negated):
    (the interval of ids the mask is about, whether the lookup is kept there (False: zeroed there
    and kept everywhere else, an inverted mask), the node to change: the negation, else the
    zeroing). None when no such mask is read."""
    nodes = ctx.rank_nodes[rank]
    for consumer, mask, keeps in _zeroings(ctx, rank, lookup):
        negation: Node | None = None
        while mask is not None and mask.inputs and (mask.op == "view" or _negates(mask)):
            if _negates(mask):
                keeps, negation = not keeps, negation or mask
            mask = nodes.get(mask.inputs[0])
        for kept_there in (keeps, not keeps):
            interval, _ = _interval(nodes, mask, kept_there, None)
            if interval is not None:
                return interval, kept_there == keeps, negation or consumer
    return None


def _zeroings(ctx: Context, rank: int, lookup: Node) -> list[tuple[Node, Node | None, bool]]:
    """The lookup's consumers that zero it by a mask (`fill`, `where`): each with its mask and
    whether the mask says where the lookup is kept (True) or zeroed (False)."""
    nodes = ctx.rank_nodes[rank]
    found = []
    for consumer_id in ctx.rank_consumers[rank].get(lookup.id, []):
        consumer = nodes[consumer_id]
        if consumer.op == "fill" and consumer.inputs[0] == lookup.id:
            found.append((consumer, nodes.get(consumer.inputs[1]), False))
        elif consumer.op == "where" and len(consumer.inputs) == 3 and lookup.id in consumer.inputs[1:]:
            found.append((consumer, nodes.get(consumer.inputs[0]), consumer.inputs[1] == lookup.id))
    return found


def _negates(node: Node) -> bool:
    return node.op == "unary" and node.attrs.get("fn") in ("logical_not", "bitwise_not")


def _clamped_shift(nodes: dict[str, Node], ids: Node | None) -> int | None:
    """c of `(ids - c)` clamped (a minimum and a maximum by literals, in either order)."""
    bounded = 0
    while ids is not None and ids.op == "scalar" and ids.attrs.get("fn") in ("minimum", "maximum", "clamp"):
        ids, bounded = nodes.get(ids.inputs[0]), bounded + 1
    if bounded and ids is not None and ids.op == "scalar" and ids.attrs.get("fn") == "sub":
        return int(ids.attrs["value"])
    return None


def _interval(
    nodes: dict[str, Node], mask: Node | None, keeps: bool, rows: tuple[int, int] | None
) -> tuple[tuple[int, int] | None, Node | None]:
    """The ids a mask of `(ids < a) | (ids >= b)` (or `(ids >= a) & (ids < b)` when it `keeps`,
    or the negation of either) keeps, and the comparison to change (see mask_interval)."""
    while mask is not None and mask.op == "unary" and mask.attrs.get("fn") in ("logical_not", "bitwise_not"):
        mask, keeps = nodes.get(mask.inputs[0]), not keeps
    combines = {False: "or", True: "and"}[keeps]  # outside = below | above; inside = above & below
    if mask is None or mask.op != "binary" or mask.attrs.get("fn") != combines:
        return None, None
    low, high = 0, None
    low_node: Node | None = None
    high_node: Node | None = None
    for value in mask.inputs:
        cmp = nodes.get(value)
        if cmp is None or cmp.op != "scalar":
            return None, None
        fn, bound = cmp.attrs.get("fn"), cmp.attrs.get("value")
        if not isinstance(bound, int | float):
            return None, None
        bound = int(bound)
        # the first id kept, or the first id past the kept ones, that this comparison states
        sides = {"lt": ("low", bound), "le": ("low", bound + 1), "ge": ("high", bound), "gt": ("high", bound + 1)}
        if keeps:
            sides = {"ge": ("low", bound), "gt": ("low", bound + 1), "lt": ("high", bound), "le": ("high", bound + 1)}
        if fn not in sides:
            return None, None
        side, at = sides[fn]
        if side == "low":
            low, low_node = at, cmp
        else:
            high, high_node = at, cmp
    if high is None:
        return None, None
    culprit: Node | None = mask
    if rows is not None and (low, high) != rows:
        wrong = [n for n, at, want in ((low_node, low, rows[0]), (high_node, high, rows[1])) if at != want]
        culprit = wrong[0] if len(wrong) == 1 and wrong[0] is not None else mask
    elif rows is None:
        culprit = next((nodes[v] for v in mask.inputs if nodes[v].attrs.get("fn") in ("le", "gt")), mask)
    return (low, high), culprit


def zeroed_outside(ctx: Context, rank: int, pick: Node) -> bool:
    """Whether the pick's value is zeroed where its targets are masked (a fill by the mask)."""
    consumers = [ctx.rank_nodes[rank][c] for c in ctx.rank_consumers[rank].get(pick.id, [])]
    while len(consumers) == 1 and consumers[0].op == "view":
        consumers = [ctx.rank_nodes[rank][c] for c in ctx.rank_consumers[rank].get(consumers[0].id, [])]
    return any(c.op in ("fill", "where") for c in consumers)
