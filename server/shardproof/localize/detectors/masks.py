"""Reading vocabulary masks off a rank's graph: `fill(ids - c, (ids < a) | (ids >= b))` and whether
a pick is zeroed where its targets are masked."""

from __future__ import annotations

from ...graph.model import Node
from ..context import Context


def mask_interval(
    ctx: Context, nodes: dict[str, Node], ids: Node | None
) -> tuple[tuple[int, int] | None, int | None, Node | None]:
    """For fill(ids - c, (ids < a) | (ids >= b)) style masks: (kept interval, c, mask node)."""
    if ids is None or ids.op not in ("fill", "where"):
        return None, None, None
    if ids.op == "fill":
        shifted, mask = nodes.get(ids.inputs[0]), nodes.get(ids.inputs[1])
    else:
        mask, shifted = nodes.get(ids.inputs[0]), nodes.get(ids.inputs[2])
    offset = None
    if shifted is not None and shifted.op == "scalar" and shifted.attrs.get("fn") == "sub":
        offset = int(shifted.attrs["value"])
    if mask is None or mask.op != "binary" or mask.attrs.get("fn") != "or":
        return None, offset, None
    low, high = 0, None
    for value in mask.inputs:
        cmp = nodes.get(value)
        if cmp is None or cmp.op != "scalar":
            return None, offset, None
        fn, bound = cmp.attrs.get("fn"), cmp.attrs.get("value")
        if not isinstance(bound, int | float):
            return None, offset, None
        bound = int(bound)
        if fn == "lt":
            low = bound
        elif fn == "le":
            low = bound + 1
        elif fn == "ge":
            high = bound
        elif fn == "gt":
            high = bound + 1
        else:
            return None, offset, None
    if high is None:
        return None, offset, None
    culprit = next((nodes[v] for v in mask.inputs if nodes[v].attrs.get("fn") in ("le", "gt")), mask)
    return (low, high), offset, culprit


def zeroed_outside(ctx: Context, rank: int, pick: Node) -> bool:
    """Whether the pick's value is zeroed where its targets are masked (a fill by the mask)."""
    consumers = [ctx.rank_nodes[rank][c] for c in ctx.rank_consumers[rank].get(pick.id, [])]
    while len(consumers) == 1 and consumers[0].op == "view":
        consumers = [ctx.rank_nodes[rank][c] for c in ctx.rank_consumers[rank].get(consumers[0].id, [])]
    return any(c.op in ("fill", "where") for c in consumers)
