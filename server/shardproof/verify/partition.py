"""Cut one world size's graphs at block boundaries into units that can be saturated at once.

A model's blocks (`layers.0`, `layers.1`, ...) run one after the other, so the graphs of the
reference and of every rank are cut into the same sequence of parts: what runs before the first
block, then each block (with what runs between it and the next). A block of more than
`SPLIT_ABOVE` nodes is cut again at its sub-modules (the attention, the MLP), whose outputs in
tensor-parallel code come from a collective. A value that one part computes and a later part
reads (the residual stream, the rotary table) crosses a cut. In the later part it becomes a
placeholder whose relation to the reference is assumed: the rank's value equals the reference's
when their shapes agree, or is the rank's block of the one dimension where they differ
(sequence parallelism). The part that computes it must then prove exactly that relation
(`Obligation`), and the last part must give the outputs the check expects.

Assume-guarantee: when every part proves its obligations under its assumptions, the whole proof
holds, because each assumption is an obligation proven upstream, on the same values. When any
part fails, nothing is concluded from the parts: the caller verifies the world size whole, which
gives the verdict and the location (so a partitioned run never reports anything a plain one
would not). Values cross cuts in the order in which a part first reads them; a pairing that does
not hold (another order on a rank) fails its obligation and falls back the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..graph.model import Graph, Node, Placeholder
from ..relations import expr as px
from ..relations.assumed import Shard, Unrelated, assumed_shard
from .relations_found import RelationIndex

# The first numbered component of a module path names the block ("layers.3", "decoder.layers.3")
_BLOCK = re.compile(r"^(.*?(?:^|\.)\d+)(?:\.|$)")
CUT_PREFIX = "shardproof.cut"
# A block with more reference nodes than this is cut again at its sub-modules (a Llama layer
# has about 50; its attention and MLP parts then saturate at once, the largest e-graph at TP=8
# with sequence parallelism shrinks from 17.5k to 10k rows)
SPLIT_ABOVE = 40
SMALLEST_PART = 12


def block_of(node: Node) -> str | None:
    match = _BLOCK.match(node.module_path)
    return match.group(1) if match else None


@dataclass(frozen=True)
class Obligation:
    """A value crossing a cut: what its producing part must prove about it."""

    reference: str  # value id in the reference
    ranks: tuple[str, ...]  # value id in each rank, in rank order
    expected: tuple[Shard | None, ...]  # per rank: None = equal, else (dim, start, end)


@dataclass
class Part:
    """One verification unit of a partitioned world size."""

    label: str  # the block it holds ("layers.3"), or "(before the first block)"
    reference: Graph
    reference_values: dict[str, px.Expr]
    ranks: list[tuple[Graph, dict[str, px.Expr]]]
    obligations: list[Obligation] = field(default_factory=list)
    final: bool = False  # holds the programs' outputs


def partition(
    reference: Graph, reference_values: dict[str, px.Expr], ranks: list[tuple[Graph, dict[str, px.Expr]]]
) -> list[Part] | None:
    """The parts of one world size, or None when its programs cannot be cut alike (fewer than two
    blocks, blocks in another order on some rank, values crossing cuts that do not pair up)."""
    programs = [(reference, reference_values), *ranks]
    cut = [_segments(graph.nodes, block_of) for graph, _ in programs]
    labels = [label for label, _ in cut[0]]
    if sum(label is not None for label in labels) < 2 or any([lb for lb, _ in c] != labels for c in cut[1:]):
        return None
    return _parts(programs, _split_large_blocks(cut))


def partition_block(
    reference: Graph,
    reference_values: dict[str, px.Expr],
    ranks: list[tuple[Graph, dict[str, px.Expr]]],
    finer: bool = False,
) -> list[Part] | None:
    """The parts of one block's programs (a memoized template, every node inside one module: the
    wrapper that called the block) cut at its sub-modules like a large block of a world size, or
    None when it does not cut into several parts alike. `finer`: a part still large is cut once
    more, a module level deeper (an attention at its output projection), and a part with no
    collective among many ranks is proven in halves of the ranks (`_halves`). Finer parts make
    smaller e-graphs that saturate at once, but state more obligations, each of which must hold:
    the caller falls back to the coarser cut when they are not all proven."""
    programs = [(reference, reference_values), *ranks]
    cut = [_segments(graph.nodes, _outermost) for graph, _ in programs]
    if any(len(segments) != 1 or segments[0][0] is None for segments in cut):
        return None
    cut = _split_large_blocks(cut)
    if finer:
        cut = _split_large_blocks(cut, _one_level_deeper)
    if len(cut[0]) < 2:
        return None
    parts = _parts(programs, cut)
    if finer and parts is not None:
        parts = [half for part in parts for half in _halves(part)]
    return parts


# A part with no collective and at least this many ranks is proven in two halves of the ranks
HALVE_FROM = 16


def _halves(part: Part) -> list[Part]:
    """A part without collectives, whose ranks' values then depend on nothing of another rank, as
    two parts of half the ranks each (with the reference): each rank's obligations are proven in
    its half as in the whole. A part holding outputs or fewer than `HALVE_FROM` ranks stays whole."""
    if part.final or len(part.ranks) < HALVE_FROM:
        return [part]
    if any(node.collective is not None for graph, _ in part.ranks for node in graph.nodes):
        return [part]
    middle = len(part.ranks) // 2
    halves = []
    for chosen in (range(middle), range(middle, len(part.ranks))):
        obligations = [
            Obligation(o.reference, tuple(o.ranks[r] for r in chosen), tuple(o.expected[r] for r in chosen))
            for o in part.obligations
        ]
        ranks = [part.ranks[r] for r in chosen]
        halves.append(Part(part.label, part.reference, part.reference_values, ranks, obligations))
    return halves


def _outermost(node: Node) -> str | None:
    return node.module_path.split(".", 1)[0] or None


def _parts(programs: list[tuple[Graph, dict[str, px.Expr]]], cut: list[Segments]) -> list[Part] | None:
    """The parts of programs cut alike into `cut`'s segments (see `partition`)."""
    labels = [label for label, _ in cut[0]]
    produced_in = [_producers(segments) for segments in cut]
    node_maps = [graph.node_map() for graph, _ in programs]
    last = len(labels) - 1
    # every output must come from the last part, which checks them
    for (graph, _), where in zip(programs, produced_in, strict=True):
        if any(where.get(value) != last for value in graph.outputs):
            return None
    parts: list[Part] = []
    for index, label in enumerate(labels):
        crossing = [
            _read_from_before(segments[index][1], where, index)
            for segments, where in zip(cut, produced_in, strict=True)
        ]
        if len({len(values) for values in crossing}) != 1:
            return None
        assumed: list[list[tuple[str, px.Expr]]] = [[] for _ in programs]
        for position, values in enumerate(zip(*crossing, strict=True)):
            target = f"{CUT_PREFIX}.{index}.{position}"
            pairing = _pair(programs, node_maps, values, target)
            if pairing is None:
                return None
            obligation, exprs = pairing
            if obligation is not None:
                sources = {where[value] for where, value in zip(produced_in, values, strict=True)}
                if len(sources) != 1:
                    return None  # computed in different parts by different programs
                parts[sources.pop()].obligations.append(obligation)
            for program, expr in enumerate(exprs):
                assumed[program].append((target, expr))
        graphs = [
            _part_graph(graph, own, values, segments[index][1], crossing_values, entries, index == last)
            for (graph, values), own, segments, crossing_values, entries in zip(
                programs, node_maps, cut, crossing, assumed, strict=True
            )
        ]
        parts.append(Part(label or "(before the first block)", *graphs[0], graphs[1:], final=index == last))
    return parts


def proven(part: Part, index: RelationIndex) -> bool:
    """Whether the saturation of `part` proves every obligation of its crossing values."""
    # (the part's ranks may be some of the world's: `_halves`)
    ranks = [graph.rank if graph.rank is not None else position for position, (graph, _) in enumerate(part.ranks)]
    for obligation in part.obligations:
        for rank, value, expected in zip(ranks, obligation.ranks, obligation.expected, strict=True):
            relations = index.relations(obligation.reference, rank)
            if expected is None:
                ok = any(rel.kind == "equal" and value in values for rel, values in relations)
            else:
                dim, start, end = expected
                ok = any(
                    rel.kind == "sel" and rel.dim == dim and rel.ranges == ((start, end),) and value in values
                    for rel, values in relations
                )
            if not ok:
                return False
    return True


Segments = list[tuple[str | None, list[Node]]]


def _split_large_blocks(cut: list[Segments], by: Callable[[Node, str], str | None] | None = None) -> list[Segments]:
    """Cut every block of more than `SPLIT_ABOVE` reference nodes again at its sub-modules (the
    attention, the MLP): in tensor-parallel code their outputs come from a collective, whole or
    sequence-sharded, so they cross a cut like a block's output. Sub-modules of fewer than
    `SMALLEST_PART` reference nodes (a norm) join the next one. A block is split only when it
    splits alike in every program. `by(node, label)`: the piece a node of the segment `label`
    belongs to (default: the block's child it runs in)."""
    key = by or (lambda node, block: _sub_module(node, block))
    refined: list[Segments] = [[] for _ in cut]
    for index, (label, nodes) in enumerate(cut[0]):
        groups = None
        if label is not None and len(nodes) > SPLIT_ABOVE:
            pieces = [_segments(own[index][1], lambda node, block=label: key(node, block)) for own in cut]
            if all([lb for lb, _ in own] == [lb for lb, _ in pieces[0]] for own in pieces[1:]):
                groups = _grouped([len(piece) for _, piece in pieces[0]])
        for program, segments in enumerate(cut):
            if groups is None or len(groups) < 2:
                refined[program].append(segments[index])
                continue
            own = pieces[program]
            for group in groups:
                first = next((own[i][0] for i in group if own[i][0] is not None), label)
                refined[program].append((first, [node for i in group for node in own[i][1]]))
    return refined


def _grouped(sizes: list[int]) -> list[list[int]]:
    """Consecutive indices grouped so that each group but the last has `SMALLEST_PART` nodes."""
    groups: list[list[int]] = [[]]
    total = 0
    for index, size in enumerate(sizes):
        groups[-1].append(index)
        total += size
        if total >= SMALLEST_PART and index < len(sizes) - 1:
            groups.append([])
            total = 0
    return groups


def _one_level_deeper(node: Node, label: str) -> str | None:
    """The module one level below the segment's (a segment labelled by a sub-module of the block,
    "block.attention_norm", is cut at modules three levels deep: "block.attention.wo"), or the
    node's own module where it runs higher up (the attention's own code between its projections)."""
    depth = label.count(".") + 2
    return ".".join(node.module_path.split(".")[:depth]) or None


def _sub_module(node: Node, block: str) -> str | None:
    """The child of `block` a node runs in ("layers.3.attention"), None for the block's own code."""
    if not node.module_path.startswith(block + "."):
        return None
    return block + "." + node.module_path[len(block) + 1 :].split(".", 1)[0]


def _segments(nodes: list[Node], key: Callable[[Node], str | None]) -> Segments:
    """Runs of nodes by `key`; nodes without one join the run before them."""
    segments: Segments = []
    for node in nodes:
        block = key(node)
        if not segments or (block is not None and block != segments[-1][0]):
            segments.append((block, [node]))
        else:
            segments[-1][1].append(node)
    return segments


def _producers(segments: list[tuple[str | None, list[Node]]]) -> dict[str, int]:
    return {node.id: index for index, (_, nodes) in enumerate(segments) for node in nodes}


def _read_from_before(nodes: list[Node], produced_in: dict[str, int], index: int) -> list[str]:
    """Values computed by earlier parts that these nodes read, in the order first read."""
    seen: dict[str, None] = {}
    for node in nodes:
        for value in node.inputs:
            if produced_in.get(value, index) < index:
                seen.setdefault(value)
    return list(seen)


def _pair(
    programs: list[tuple[Graph, dict[str, px.Expr]]],
    node_maps: list[dict[str, Node]],
    values: tuple[str, ...],
    target: str,
) -> tuple[Obligation | None, list[px.Expr]] | None:
    """The assumed value of one crossing value in every program (named `target`), from the
    shapes, and what its producing part must prove for it; None when no relation fits."""
    nodes = [own[value] for own, value in zip(node_maps, values, strict=True)]
    if all(node.op == "uninitialized" for node in nodes):
        # a buffer reused without being read (Megatron's global memory buffer): nothing is
        # assumed about it, and nothing needs proving
        return None, [
            px.Fresh(reason=f"uninitialized {graph.name}/{node.id}", shape=node.meta.shape, dtype=node.meta.dtype)
            for (graph, _), node in zip(programs, nodes, strict=True)
        ]
    reference_meta = nodes[0].meta
    whole = px.ParamRef(name=target, shape=reference_meta.shape, dtype=reference_meta.dtype)
    exprs: list[px.Expr] = [whole]
    expected: list[Shard | None] = []
    for (graph, _), node in zip(programs[1:], nodes[1:], strict=True):
        meta = node.meta
        try:
            shard = assumed_shard(reference_meta, meta, graph.rank)
        except Unrelated:
            return None
        expected.append(shard)
        if shard is None:
            exprs.append(whole)
            continue
        dim, start, end = shard
        exprs.append(px.SliceOf(source=whole, dim=dim, start=start, end=end, shape=meta.shape, dtype=meta.dtype))
    return Obligation(values[0], tuple(values[1:]), tuple(expected)), exprs


def _part_graph(
    graph: Graph,
    node_map: dict[str, Node],
    values: dict[str, px.Expr],
    nodes: list[Node],
    crossing: list[str],
    assumed: list[tuple[str, px.Expr]],
    final: bool,
) -> tuple[Graph, dict[str, px.Expr]]:
    read = {value for node in nodes for value in node.inputs}
    placeholders = [p for p in graph.placeholders if p.id in read]
    own_values = dict(values)
    for value, (target, expr) in zip(crossing, assumed, strict=True):
        placeholders.append(Placeholder(value, "buffer", target, node_map[value].meta))
        own_values[target] = expr
    part = Graph(
        graph.name,
        graph.rank,
        graph.world_size,
        placeholders,
        list(nodes),
        list(graph.outputs) if final else [],
        graph.source_files,
        graph.plan_entries,
        view_twins=graph.view_twins,  # (the encoder states those whose values the part holds)
    )
    return part, own_values
