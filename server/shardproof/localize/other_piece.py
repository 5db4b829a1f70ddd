"""Another piece of the right values: a rank that takes, from values related alike to the
reference's, a piece the reference also takes but uses elsewhere (the last dims of a head where
the reference rotates the first, the passed dims given to the rotation). Its parameters and
everything before are right, so the line to change is where the piece is taken, not where the
weights were loaded."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.model import Node
from ..results import Site
from .context import Context
from .wording import describe_op


@dataclass(frozen=True)
class AnotherPiece:
    site: Site | None
    rank_piece: str  # `the slice [2:4] of dim -1`
    ref_piece: str


def another_piece(
    ctx: Context, ref_node: Node, aligned: Node, rank: int, ref_value: str, value: str
) -> AnotherPiece | None:
    """The piece taken wrong, for the rank's `value` read by `aligned` where the reference's
    `ref_node` reads `ref_value`; None unless the rank's value is (computed alike from) another
    piece the reference takes of the same values. When the rank's operation reading it is written
    otherwise than the reference's, that reading is the line to change."""
    found = _taken(ctx, rank, ref_value, value, depth=0)
    if found is None:
        return None
    piece, ref_piece = found
    reading, ref_reading = ctx.rank_site(aligned), ctx.ref_site(ref_node)
    written_otherwise = (
        reading is not None and ref_reading is not None and reading.code.strip() != ref_reading.code.strip()
    )
    if piece.id == value and written_otherwise:
        site = ctx.rank_site(aligned, "this operation reads another piece than the reference's")
    else:
        site = ctx.rank_site(piece, "this piece is taken here; the reference takes another one for this use")
    return AnotherPiece(site, _described(piece), _described(ref_piece))


def _taken(ctx: Context, rank: int, ref_value: str, value: str, depth: int) -> tuple[Node, Node] | None:
    """(the rank's piece, the reference's) where `value` stands for `ref_value`: `value` itself when
    it is related to a sibling of `ref_value` (made by the same op from the same values), else
    through an op applied alike to the pieces (a view of the wrong piece is not the view of the
    right one)."""
    made, ref_made = ctx.rank_node(rank, value), ctx.ref_nodes.get(ref_value)
    if made is None or ref_made is None or made.op != ref_made.op or len(made.inputs) != len(ref_made.inputs):
        return None
    pairs = list(zip(ref_made.inputs, made.inputs, strict=True))
    related = {r for _, refs in ctx.index.relations_of_rank_value(rank, value) for r in refs} - {ref_value}
    if related:
        if not any(_sibling(ctx.ref_nodes.get(r), ref_made) for r in related):
            return None
        if not all(ctx.relations_between(r, rank, v) for r, v in pairs):
            return None
        return made, ref_made
    if depth > 8 or _unsized(made.attrs) != _unsized(ref_made.attrs):
        return None
    for r, v in pairs:
        if not ctx.relations_between(r, rank, v):
            return _taken(ctx, rank, r, v, depth + 1)
    return None


def _unsized(attrs: dict) -> dict:
    """An op's attributes but the shape it makes (a view of a rank's block has the block's)."""
    return {k: v for k, v in attrs.items() if k != "shape"}


def _sibling(node: Node | None, of: Node) -> bool:
    """Another value the reference makes by the same op from the same values."""
    return node is not None and node.id != of.id and node.op == of.op and node.inputs == of.inputs


def _described(node: Node) -> str:
    if node.op == "slice":
        return f"the slice [{node.attrs.get('start')}:{node.attrs.get('end')}] of dim {node.attrs.get('dim')}"
    return f"the {describe_op(node)}"
