"""What an all-to-all or an all-gather, with the views and permutes around it, moves where.

An expert-parallel dispatch sends expert block j of a rank's slots to rank j and lays the
received blocks out again (`received.view(ranks, experts, ...).transpose(0, 1).reshape(...)`); a
gather along dim d may be written as movedim(d, 0), all_gather, movedim(0, d). Lowered call by
call, the result is a view of a permute of a view of a concatenation of slices, which no
selection rule follows. But the whole chain is data movement over tensors of known shapes, so it
can be evaluated on index tensors: which element of which rank's source lands where. When the
result is a concatenation, in rank order along one dim, of one block of every rank's source
(along one dim of the source), that concatenation is the value: a fact found by computing it,
so it holds exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from ..graph.model import Collective, Graph, Node

_LAYOUT_OPS = ("view", "permute")
_MAX_ELEMENTS = 1 << 22  # larger exchanges keep the call-by-call lowering


@dataclass(frozen=True)
class Piece:
    rank: int
    value: str  # the value id in that rank's graph
    dim: int  # negative; the sliced dim of that value (ignored when whole)
    start: int
    end: int
    whole: bool


@dataclass(frozen=True)
class Source:
    """A value an exchanged tensor is a view / permute of, and the layout nodes from it to the
    exchanged tensor (in order)."""

    value: str
    shape: tuple[int, ...]
    steps: tuple[Node, ...]


@dataclass(frozen=True)
class Exchange:
    """One matched all-to-all / all-gather call: every member's call node and graph."""

    kind: str
    group: tuple[int, ...]
    calls: dict[int, Node]
    graphs: dict[int, Graph]

    @cached_property
    def sources(self) -> dict[int, list[Source]]:
        """Per member, its exchanged input and each value that is a view / permute of, nearest
        first (the same for every receiver and every layout step after the exchange)."""
        found: dict[int, list[Source]] = {}
        for r in self.group:
            graph = self.graphs[r]
            nodes = graph.node_map()
            value = self.calls[r].inputs[0]
            steps: tuple[Node, ...] = ()
            found[r] = [Source(value, graph.meta_of(value).shape, steps)]
            node = nodes.get(value)
            while node is not None and node.op in _LAYOUT_OPS and len(found[r]) < 8:
                steps = (node, *steps)
                value = node.inputs[0]
                found[r].append(Source(value, graph.meta_of(value).shape, steps))
                node = nodes.get(value)
        return found


def rows_sent(coll: Collective, rows: int, members: int, receiver_index: int) -> tuple[int, int]:
    """[start, end) of the rows of a member's all-to-all input that go to the receiver."""
    splits = coll.input_splits or tuple([rows // members] * members)
    start = sum(splits[:receiver_index])
    return start, start + splits[receiver_index]


def _apply(values, nodes: tuple[Node, ...] | list[Node]):  # type: ignore[no-untyped-def]
    for node in nodes:
        values = values.reshape(node.meta.shape) if node.op == "view" else values.permute(*node.attrs["perm"])
    return values


def fold(exchange: Exchange, receiver: int, after: list[Node]) -> list[tuple[list[Piece], int]]:
    """Every reading of the receiver's value after the exchange and the layout nodes `after` (in
    order) as a concatenation, along one dim, of blocks of the members' sources (the values the
    exchanged ones are views / permutes of, at any depth). Size-1 dims can make several true."""
    depth = max(len(chain) for chain in exchange.sources.values())
    if depth == 1 and not after:
        return []  # no layout on either side: the call-by-call lowering says it all
    import torch

    readings: list[tuple[list[Piece], int]] = []
    for level in range(depth):
        sources = {r: chain[min(level, len(chain) - 1)] for r, chain in exchange.sources.items()}
        for reading in _fold_from(exchange, receiver, after, sources, torch):
            if reading not in readings:
                readings.append(reading)
    return readings


def _fold_from(exchange, receiver, after, sources, torch):  # type: ignore[no-untyped-def]
    calls, group = exchange.calls, exchange.group
    shapes = {r: sources[r].shape for r in group}
    if any(math.prod(shape) > _MAX_ELEMENTS for shape in shapes.values()):
        return []
    base = max(math.prod(shape) for shape in shapes.values()) + 1
    sent = {}
    for index, r in enumerate(group):
        tagged = torch.arange(math.prod(shapes[r]), dtype=torch.int64).reshape(shapes[r]) + index * base
        sent[r] = _apply(tagged, sources[r].steps)
    if exchange.kind == "all_gather":
        received = torch.cat([sent[r] for r in group], dim=0)
    else:
        me = group.index(receiver)
        parts = []
        for r in group:
            coll = calls[r].collective
            assert coll is not None
            start, end = rows_sent(coll, sent[r].shape[0], len(group), me)
            parts.append(sent[r][start:end])
        received = torch.cat(parts, dim=0)
    if math.prod(received.shape) != math.prod(calls[receiver].meta.shape):
        return []
    result = _apply(received.reshape(calls[receiver].meta.shape), after)
    readings = []
    for dim in range(result.dim()):
        pieces = _pieces_along(result, dim, group, {r: sources[r].value for r in group}, shapes, base, torch)
        if pieces is not None:
            readings.append((pieces, dim - result.dim()))
    return readings


def _pieces_along(result, dim, group, sources, shapes, base, torch):  # type: ignore[no-untyped-def]
    moved = result.movedim(dim, 0)
    owners = (moved // base).reshape(moved.shape[0], -1)
    if owners.shape[1] == 0 or not bool((owners == owners[:, :1]).all()):
        return None
    runs: list[tuple[int, int, int]] = []  # (owner index, start, end) along dim
    for position, owner in enumerate(owners[:, 0].tolist()):
        if runs and runs[-1][0] == owner:
            runs[-1] = (owner, runs[-1][1], position + 1)
        else:
            runs.append((owner, position, position + 1))
    if [owner for owner, _, _ in runs] != list(range(len(group))):
        return None
    pieces = []
    for owner, start, end in runs:
        rank = group[owner]
        block = result.narrow(dim, start, end - start) - owner * base
        piece = _block_of(block, shapes[rank], torch)
        if piece is None:
            return None
        sliced_dim, first, last, whole = piece
        pieces.append(Piece(rank, sources[rank], sliced_dim, first, last, whole))
    return pieces


def _block_of(block, shape, torch):  # type: ignore[no-untyped-def]
    """(dim, start, end, whole) when `block` holds the positions of a contiguous block of a tensor
    of `shape` along one dim, in order."""
    if block.dim() != len(shape):
        return None
    source = torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)
    if tuple(block.shape) == tuple(shape) and torch.equal(block, source):
        return -1, 0, shape[-1], True
    first = block.reshape(-1)[0].item()
    for d in range(len(shape)):
        if any(block.shape[i] != shape[i] for i in range(len(shape)) if i != d):
            continue
        start = (first // math.prod(shape[d + 1 :])) % shape[d]
        length = block.shape[d]
        if start + length <= shape[d] and torch.equal(block, source.narrow(d, start, length)):
            return d - len(shape), start, start + length, False
    return None
