"""An output that fails though every value before it is related: a wrong shape (wrong-layout),
shards in the wrong order (shard-order), partial sums returned (missing-reduction). Reads the
relations of the outputs."""

from __future__ import annotations

import itertools
from typing import Any

from ...results import Discrepancy
from ...verify.relations_found import ranges_text
from ..context import Context
from .reduction_coverage import reduction_coverage


def output_mismatch(ctx: Context, failing_outputs: list[int]) -> Discrepancy:
    index = failing_outputs[0] if failing_outputs else 0
    ref_value = ctx.reference.outputs[index] if index < len(ctx.reference.outputs) else ""
    ref_node = ctx.ref_nodes.get(ref_value)
    ref_meta = ctx.reference.meta_of(ref_value) if ref_value else None
    for rank, graph in enumerate(ctx.ev.ranks):
        if index >= len(graph.outputs):
            continue
        value = graph.outputs[index]
        node = ctx.rank_node(rank, value)
        meta = graph.meta_of(value)
        if ref_meta is not None and meta.shape != ref_meta.shape:
            return _with_output_picture(
                ctx,
                ref_value,
                rank,
                value,
                f"shape {list(meta.shape)} ≠ {list(ref_meta.shape)}",
                Discrepancy(
                    kind="wrong-layout",
                    message=f"rank {rank} returns output {index} with shape {list(meta.shape)}; the reference "
                    f"returns {list(ref_meta.shape)}",
                    primary=ctx.rank_site(node) if node else None,
                    reference=ctx.ref_site(ref_node) if ref_node else None,
                    ranks=[rank],
                    reference_node=ref_value,
                    parallel_nodes=[f"{graph.name}/{value}"],
                    expected=f"shape {list(ref_meta.shape)}",
                    found=f"shape {list(meta.shape)}",
                    suggestion="gather or reshape along the dimension the reference uses",
                    details={"culprit": f"{graph.name}/{value}"},
                ),
            )
    if ref_node is not None:
        covered = _reduced_output_coverage(ctx, ref_node, ref_value, index)
        if covered is not None:
            return covered
    spans = []
    for rank, graph in enumerate(ctx.ev.ranks):
        rels = ctx.relations_between(ref_value, rank, graph.outputs[index]) if index < len(graph.outputs) else []
        spans.append(rels)
    node = ctx.rank_node(0, ctx.ev.ranks[0].outputs[index]) if ctx.ev.ranks else None
    found = (
        "; ".join(
            f"rank {r}: {rels[0].describe(ref_meta.shape if ref_meta else None)}"
            for r, rels in enumerate(spans)
            if rels
        )
        or "values unrelated to the reference output"
    )
    sel = [rels[0] for rels in spans if rels and rels[0].kind == "sel"]
    kind = "not-equivalent"
    if sel and len(sel) == len(spans):
        misplaced = _misplaced_piece(ctx, ref_value, index, ref_meta.shape if ref_meta else None)
        if misplaced is not None:
            return misplaced
        kind = "shard-order"
    elif any(rels and rels[0].kind == "psum" for rels in spans):
        kind = "missing-reduction"
    rank0_output = ctx.ev.ranks[0].outputs[index] if ctx.ev.ranks else ""
    return _with_output_picture(
        ctx,
        ref_value,
        0,
        rank0_output,
        spans[0][0].describe(ref_meta.shape if ref_meta else None) if spans and spans[0] else "no relation",
        Discrepancy(
            kind=kind,
            message=f"{_output_name(ctx, index)} does not equal the reference's on every rank ({found})",
            primary=ctx.rank_site(node) if node else None,
            reference=ctx.ref_site(ref_node) if ref_node else None,
            ranks=list(range(len(ctx.ev.ranks))),
            reference_node=ref_value,
            expected=_output_expectation(ctx, index),
            found=found,
            suggestion=_output_suggestion(ctx, index, kind),
            details={"culprit": f"{ctx.ev.ranks[0].name}/{rank0_output}"} if rank0_output else {},
        ),
    )


def _misplaced_piece(ctx: Context, ref_value: str, index: int, ref_shape: tuple[int, ...] | None) -> Discrepancy | None:
    """An output gathered from the ranks' pieces, each one block of the reference's output along
    the gather's dim, where the blocks do not tile it (they overlap or leave a gap): the all-gather
    puts rank r's piece r-th, so a rank whose piece is not the r-th block cut it wrong (a sequence
    shard taken at the wrong offset). Reported at the cut that made that rank's piece; blocks that
    tile in another order are left to shard-order."""
    if ref_shape is None:
        return None
    pieces = []
    for rank, graph in enumerate(ctx.ev.ranks):
        gather = _feeding_gather(ctx, rank, graph.outputs[index]) if index < len(graph.outputs) else None
        if gather is None:
            return None
        piece = gather.inputs[0]
        blocks = [
            rel for rel in ctx.relations_between(ref_value, rank, piece) if rel.kind == "sel" and len(rel.ranges) == 1
        ]
        if not blocks:
            return None
        pieces.append((rank, piece, blocks[0]))
    if len({rel.dim for _, _, rel in pieces}) != 1:
        return None
    dim = pieces[0][2].dim
    spans = sorted(rel.ranges[0] for _, _, rel in pieces)
    whole = spans[0][0] == 0 and spans[-1][1] == ref_shape[dim]
    tiles = whole and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    if tiles:
        return None
    off = [(r, piece, rel) for r, piece, rel in pieces if rel.ranges[0] != _block_of(rel.ranges[0], r)]
    if not off:
        return None
    rank, piece, rel = off[0]
    cut = _cut_of(ctx, rank, piece, rel)
    expected = _block_of(rel.ranges[0], rank)
    holds = rel.describe(ref_shape)
    overlap = any(a[1] > b[0] for a, b in itertools.pairwise(spans))
    found = Discrepancy(
        kind="wrong-shard",
        message=(
            f"rank {rank}'s piece of the gathered output is {holds}, where the gather puts its block "
            f"{ranges_text((expected,))}: the ranks' pieces {'overlap' if overlap else 'leave a gap'} "
            f"({', '.join(ranges_text((r.ranges[0],)) for _, _, r in pieces)} in rank order)"
        ),
        primary=ctx.rank_site(cut, "the cut that makes this rank's piece") if cut is not None else None,
        reference=ctx.ref_site(ctx.ref_nodes[ref_value]) if ref_value in ctx.ref_nodes else None,
        ranks=[rank],
        reference_node=ref_value,
        parallel_nodes=[f"{ctx.ev.ranks[rank].name}/{cut.id if cut is not None else piece}"],
        expected=f"rank {rank}'s piece is the block {ranges_text((expected,))} of the gathered dim",
        found=holds,
        suggestion=f"cut rank {rank}'s piece at [{expected[0]}:{expected[1]}] (its rank times the piece's size)",
        details={"culprit": f"{ctx.ev.ranks[rank].name}/{cut.id if cut is not None else piece}"},
    )
    return found


def _block_of(span: tuple[int, int], rank: int) -> tuple[int, int]:
    """The rank-th block of a piece's size: where a gather in rank order puts that rank's piece."""
    size = span[1] - span[0]
    return rank * size, (rank + 1) * size


def _feeding_gather(ctx: Context, rank: int, value: str) -> Any:
    """The all-gather an output is read off (through the cat, slices, views and permutes that
    take its buffer apart and put it together again), or None."""
    node = ctx.rank_node(rank, value)
    for _ in range(20):
        if node is None:
            return None
        if node.collective is not None and node.collective.kind == "all_gather":
            return node
        if node.op not in ("cat", "slice", "view", "permute") or not node.inputs:
            return None
        node = ctx.rank_node(rank, node.inputs[0])
    return None


def _cut_of(ctx: Context, rank: int, value: str, rel: Any) -> Any:
    """The rank node that took the selection `rel` holds: walking back through inputs that hold
    the same block of the same dim, the first node none of whose inputs does."""
    node = ctx.rank_node(rank, value)
    for _ in range(40):
        if node is None:
            return None
        carrying = [
            v
            for v in node.inputs
            if any(
                other.kind == "sel" and other.dim == rel.dim and other.ranges == rel.ranges
                for other, _ in ctx.index.relations_of_rank_value(rank, v)
            )
        ]
        if not carrying:
            return node
        node = ctx.rank_node(rank, carrying[0])
    return None


def _with_output_picture(
    ctx: Context, ref_value: str, rank: int, value: str, label: str, found: Discrepancy
) -> Discrepancy:
    """The reference's output and the rank's output side by side, each under the operation that
    feeds it (for a gathered output: the gather), linked by what the rank actually returns."""
    reference = [{**ctx._ref_row(ref_value, broken=True), "row": 1}]
    parallel = [{**ctx._rank_row(rank, value, broken=True), "row": 1}]
    edges: list[dict[str, Any]] = []
    ref_node, node = ctx.ref_nodes.get(ref_value), ctx.rank_node(rank, value)
    if ref_node is not None and ref_node.inputs:
        reference.insert(0, {**ctx._ref_row(ref_node.inputs[0]), "row": 0})
        edges.append({"column": "reference", "from": 0, "to": 1})
    if node is not None and node.inputs:
        parallel.insert(0, {**ctx._rank_row(rank, node.inputs[0]), "row": 0})
        edges.append({"column": "parallel", "from": 0, "to": 1})
    found.details.setdefault(
        "neighbourhood",
        {
            "rank": rank,
            "reference": reference,
            "parallel": parallel,
            "links": [{"row": 1, "label": label, "status": "broken"}],
            "edges": edges,
        },
    )
    return found


def _output_name(ctx: Context, index: int) -> str:
    parameter = ctx._gradient_of(index)
    return f"the gradient of `{parameter}`" if parameter else f"output {index}"


def _output_expectation(ctx: Context, index: int) -> str:
    if ctx._gradient_of(index):
        return "every rank holds the reference gradient whole, or the block of it its parameter holds"
    return "every rank returns the reference output (or the declared output relation)"


def _output_suggestion(ctx: Context, index: int, kind: str) -> str:
    if ctx._gradient_of(index) and kind == "missing-reduction":
        return "all-reduce this gradient over the ranks after backward (each rank's covers only its own part)"
    return "combine the ranks' results so that each returns the full output"


def _reduced_output_coverage(ctx: Context, ref_node: Any, ref_value: str, index: int) -> Discrepancy | None:
    """An output that is an all-reduce of the ranks' partial sums of the reference's output, which
    fails: the partial sums do not tile the reduction (a gap, an overlap, a missing rank)."""
    for rank, graph in enumerate(ctx.ev.ranks):
        if index >= len(graph.outputs):
            continue
        node = ctx.rank_node(rank, graph.outputs[index])
        if node is None or node.op != "all_reduce" or not node.inputs:
            continue
        if any(rel.kind == "psum" for rel in ctx.relations_between(ref_value, rank, node.inputs[0])):
            return reduction_coverage(ctx, ref_node, ref_value, rank, node)
    return None
