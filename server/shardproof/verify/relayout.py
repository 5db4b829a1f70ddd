"""What an all-to-all or an all-gather, with the views and permutes around it, moves where.

An expert-parallel dispatch sends expert block j of a rank's slots to rank j and lays the
received blocks out again (`received.view(ranks, experts, ...).transpose(0, 1).reshape(...)`); a
gather along dim d may be written as movedim(d, 0), all_gather, movedim(0, d). Lowered call by
call, the result is a view of a permute of a view of a concatenation of slices, which no
selection rule follows. But the whole chain is data movement over tensors of known shapes, so it
can be evaluated on index tensors: which element of which rank's source lands where. When the
result is a concatenation along one dim of one block (along one dim of the source) of each of
some ranks' sources, that concatenation is the value: a fact found by computing it, so it holds
exactly. (Every rank's block in rank order is the usual one; one rank's block alone is what a
rank picks out of the received value by its index, `received.view(ranks, ...)[rank]`.)

After the exchange the blocks may also be merged by a view: DeepSpeed-Ulysses' exchange back from
head blocks to sequence blocks moves each rank's heads next to the others' and merges heads and
head dim into the hidden dim. The value is then a view of a permuted concatenation, whose shape
and permutation are read off the tagged positions (`_merged_readings`) and checked the same way.

The movement on either side may be a small graph rather than a chain: `dist.all_to_all` with lists
of tensors is captured as the pieces flattened and concatenated into one buffer, and the
received buffer sliced, viewed back and concatenated again (DeepSpeed-Ulysses' exchange between
sequence and head shards). Views, permutes, slices and concatenations are all data movement, so
the same evaluation covers them: a source is any value the exchanged tensor is computed from by
data movement alone, and after the exchange any value computed by data movement from the
received one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from ..graph.model import Collective, Graph, Node

MOVEMENT_OPS = ("view", "permute", "slice", "cat")
_MAX_ELEMENTS = 1 << 22  # larger exchanges keep the call-by-call lowering
_MAX_SOURCE_STEPS = 12


@dataclass(frozen=True)
class Piece:
    rank: int
    value: str  # the value id in that rank's graph
    dim: int  # negative; the sliced dim of that value (ignored when whole)
    start: int
    end: int
    whole: bool
    inserted: bool = False  # the whole value with a unit dim inserted at the concatenation dim (a stack)


@dataclass(frozen=True)
class Source:
    """A value the exchanged tensor is computed from by data movement alone, and the movement
    nodes from it to the exchanged tensor (in the graph's order; none when it is that tensor)."""

    value: str
    shape: tuple[int, ...]
    steps: tuple[Node, ...]
    target: str  # the exchanged tensor


@dataclass(frozen=True)
class Exchange:
    """One matched all-to-all / all-gather call: every member's call node and graph."""

    kind: str
    group: tuple[int, ...]
    calls: dict[int, Node]
    graphs: dict[int, Graph]

    @cached_property
    def received(self) -> dict[tuple[int, int], dict | None]:
        """(receiver, source level) -> what the receiver got, as tagged source positions, and the
        movement after it evaluated so far, by value id (memo; None: the sizes do not match)."""
        return {}

    @cached_property
    def readings(self) -> dict[tuple, list]:
        """(receiver, source level, the movement after it by structure) -> its readings (memo).
        Every member of an all-gather receives the same value, so there the receiver is left out
        and the ranks' identical movement after it is evaluated once."""
        return {}

    @cached_property
    def sources(self) -> dict[int, list[Source]]:
        """Per member, its exchanged input and each value it is computed from by data movement
        alone, nearest first (the same for every receiver and every movement after the exchange)."""
        return {r: _sources(self.graphs[r], self.calls[r].inputs[0]) for r in self.group}


def _sources(graph: Graph, target: str) -> list[Source]:
    """`target` and every single value it is computed from by movement nodes alone: the movement
    nodes between are opened latest first, and wherever one value is left, it is a source."""
    nodes = graph.node_map()
    order = {node.id: i for i, node in enumerate(graph.nodes)}
    found = [Source(target, graph.meta_of(target).shape, (), target)]
    frontier, steps = {target}, []
    while len(steps) < _MAX_SOURCE_STEPS:
        movable = [v for v in frontier if v in nodes and nodes[v].op in MOVEMENT_OPS]
        if not movable:
            break
        latest = max(movable, key=lambda v: order[v])
        node = nodes[latest]
        frontier.remove(latest)
        frontier.update(node.inputs)
        steps.append(node)
        if len(frontier) == 1:
            (value,) = frontier
            ordered = tuple(sorted(steps, key=lambda n: order[n.id]))
            found.append(Source(value, graph.meta_of(value).shape, ordered, target))
    return found


def rows_sent(coll: Collective, rows: int, members: int, receiver_index: int) -> tuple[int, int]:
    """[start, end) of the rows of a member's all-to-all input that go to the receiver."""
    splits = coll.input_splits or tuple([rows // members] * members)
    start = sum(splits[:receiver_index])
    return start, start + splits[receiver_index]


def _evaluate(start: str, values, nodes: tuple[Node, ...] | list[Node]):  # type: ignore[no-untyped-def]
    """The last of `nodes` (movement nodes in graph order) computed from `values` standing for
    the value `start`; `values` itself when there are none."""
    return _evaluate_into({start: values}, nodes) if nodes else values


def _evaluate_into(env: dict, nodes: tuple[Node, ...] | list[Node]):  # type: ignore[no-untyped-def]
    """The last of `nodes` computed from the values in `env`, which keeps every value computed
    (movement nodes after one exchange share their inputs' values)."""
    import torch

    if not nodes:
        return next(iter(env.values()))
    for node in nodes:
        if node.id in env:
            continue
        ins = [env[v] for v in node.inputs]
        a = node.attrs
        if node.op == "view":
            env[node.id] = ins[0].reshape(node.meta.shape)
        elif node.op == "permute":
            env[node.id] = ins[0].permute(*a["perm"])
        elif node.op == "slice":
            env[node.id] = ins[0].narrow(a["dim"], a["start"], a["end"] - a["start"])
        else:
            env[node.id] = torch.cat(ins, dim=a["dim"])
    return env[nodes[-1].id]


Reading = tuple[list[Piece], int, tuple[int, ...] | None]


def fold(exchange: Exchange, receiver: int, after: list[Node]) -> list[Reading]:
    """Every reading of the receiver's value after the exchange and the movement nodes `after` (in
    graph order, the last one the value) as a concatenation, along one dim, of blocks of the
    members' sources (values the exchanged ones are computed from by movement alone, at any
    depth), or as a permutation of such a concatenation (the third element: the value is the
    concatenation `.permute(perm)`; None when it is the concatenation itself). Size-1 dims can
    make several true."""
    depth = max(len(chain) for chain in exchange.sources.values())
    if depth == 1 and not after:
        return []  # no layout on either side: the call-by-call lowering says it all
    import torch

    readings: list[tuple[list[Piece], int]] = []
    for level in range(depth):
        sources = {r: chain[min(level, len(chain) - 1)] for r, chain in exchange.sources.items()}
        for reading in _fold_from(exchange, receiver, after, sources, level, torch):
            if reading not in readings:
                readings.append(reading)
    return readings


def _fold_from(exchange, receiver, after, sources, level, torch):  # type: ignore[no-untyped-def]
    key = (None if exchange.kind == "all_gather" else receiver, level, _structure(exchange.calls[receiver], after))
    if key not in exchange.readings:
        exchange.readings[key] = _fold_from_uncached(exchange, receiver, after, sources, level, torch)
    return exchange.readings[key]


def _structure(call: Node, after: list[Node]) -> tuple:
    """The movement after an exchange up to node names: each node's op, attributes, shape and
    inputs (by position in the chain, the exchange's output first)."""
    position = {call.id: 0} | {node.id: i + 1 for i, node in enumerate(after)}
    return tuple(
        (
            node.op,
            repr(sorted(node.attrs.items())),
            node.meta.shape,
            tuple(position.get(v, v) for v in node.inputs),
        )
        for node in after
    )


def _fold_from_uncached(exchange, receiver, after, sources, level, torch):  # type: ignore[no-untyped-def]
    calls, group = exchange.calls, exchange.group
    shapes = {r: sources[r].shape for r in group}
    if any(math.prod(shape) > _MAX_ELEMENTS for shape in shapes.values()):
        return []
    base = max(math.prod(shape) for shape in shapes.values()) + 1
    key = (receiver, level)
    if key not in exchange.received:  # the same for every movement node after the exchange
        received = _received(exchange, receiver, sources, shapes, base, torch)
        exchange.received[key] = None if received is None else {calls[receiver].id: received}
    env = exchange.received[key]
    if env is None:
        return []
    result = _evaluate_into(env, after)
    if result.numel() == 0:
        return []  # an empty slice of the received value holds nothing to relate
    readings = _readings(result, None, group, sources, shapes, base, torch)
    if not readings and result.dim() <= _MAX_PERMUTED_DIMS and result.numel() <= _MAX_PERMUTED_ELEMENTS:
        # one permute moved the blocks' dims out of their sources' order (the received blocks of an
        # all-to-all reshaped and moved with `permute(1, 2, 0, 3)`): the value is a permutation of
        # a concatenation in the sources' order, found the same way
        import itertools

        for perm in itertools.permutations(range(result.dim())):
            if list(perm) == sorted(perm):
                continue
            inverse = [perm.index(d) for d in range(len(perm))]
            readings = _readings(result.permute(*inverse), perm, group, sources, shapes, base, torch)
            if readings:
                break
    if not readings:
        readings = _merged_readings(result, group, sources, shapes, base, torch)
    return readings


def _merged_readings(result, group, sources, shapes, base, torch):  # type: ignore[no-untyped-def]
    """Readings of `result` as a view of a permuted concatenation of the sources' blocks: the
    exchange back from head blocks to sequence blocks (Ulysses) moves each rank's heads next to
    the others' and merges heads and head dim into the hidden dim with one view. The concatenation's
    shape and the permutation are read off the tagged positions (each member's block is the box
    its positions span; a dim's stride in `result` is where the position one step along it lands),
    then `_readings` checks the candidate exactly, so a wrong guess only finds no reading."""
    shape = shapes[group[0]]
    k = len(shape)
    if k == 0 or any(tuple(shapes[r]) != tuple(shape) for r in group) or result.numel() > _MAX_ELEMENTS:
        return []
    flat = result.reshape(-1)
    owner = flat // base
    coords = torch.stack(torch.unravel_index(flat % base, tuple(shape)), dim=1)
    starts, size = [], None
    for index in range(len(group)):
        mine = coords[owner == index]
        if mine.shape[0] == 0:
            return []
        low, high = mine.min(dim=0).values, mine.max(dim=0).values
        box = (high - low + 1).tolist()
        if math.prod(box) != mine.shape[0] or (size is not None and box != size):
            return []  # not one block per member, or blocks of other shapes
        starts.append(low)
        size = box
    assert size is not None
    local = coords - torch.stack(starts)[owner]
    readings = []
    for along in range(k):
        whole = list(size)
        whole[along] *= len(group)
        position = local.clone()
        position[:, along] += owner * size[along]
        index = sum(position[:, d] * math.prod(whole[d + 1 :]) for d in range(k))
        if not bool((torch.bincount(index, minlength=flat.numel()) == 1).all()):
            return []  # some position twice: not a movement of one concatenation
        where = torch.empty_like(index)
        where[index] = torch.arange(flat.numel())
        if int(where[0]) != 0:
            continue
        strides = {d: int(where[math.prod(whole[d + 1 :])]) for d in range(k) if whole[d] > 1}
        moved = sorted(strides, key=lambda d: -strides[d])
        perm = [d for d in range(k) if d not in strides]  # unit dims first: where they go does not matter
        perm += moved
        permuted = [whole[d] for d in perm]
        inverse = [perm.index(d) for d in range(k)]
        candidate = result.reshape(permuted).permute(*inverse)
        found = _readings(candidate, None if perm == sorted(perm) else tuple(perm), group, sources, shapes, base, torch)
        readings.extend(r for r in found if r not in readings)
    return readings


# permutations are searched for values of at most this many dims and elements (120 permutations)
_MAX_PERMUTED_DIMS = 5
_MAX_PERMUTED_ELEMENTS = 1 << 16


def _readings(result, perm, group, sources, shapes, base, torch):  # type: ignore[no-untyped-def]
    """The readings of `result` as a concatenation of the sources' blocks, each with `perm`."""
    readings = []
    owners = (result // base).to(torch.int16 if len(group) < 2**15 else torch.int64)  # once for every dim
    for dim in range(result.dim()):
        values = {r: sources[r].value for r in group}
        pieces = _pieces_along(result, owners, dim, group, values, shapes, base, torch)
        if pieces is not None:
            readings.append((pieces, dim - result.dim(), perm))
            if len(pieces) == 1:
                break  # one member's block: the same along every dim
    return readings


def _received(exchange, receiver, sources, shapes, base, torch):  # type: ignore[no-untyped-def]
    """The receiver's exchange output as tagged positions of the members' sources, or None."""
    calls, group = exchange.calls, exchange.group
    sent = {}
    for index, r in enumerate(group):
        tagged = torch.arange(math.prod(shapes[r]), dtype=torch.int64).reshape(shapes[r]) + index * base
        sent[r] = _evaluate(sources[r].value, tagged, sources[r].steps)
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
        return None
    return received.reshape(calls[receiver].meta.shape)


def _pieces_along(result, owners, dim, group, sources, shapes, base, torch):  # type: ignore[no-untyped-def]
    """The blocks along `dim` of `result` (tagged positions; `owners` its members' indices)."""
    owners = owners.movedim(dim, 0).reshape(owners.shape[dim], -1)
    if owners.shape[1] == 0 or not bool((owners == owners[:, :1]).all()):
        return None
    runs: list[tuple[int, int, int]] = []  # (owner index, start, end) along dim
    for position, owner in enumerate(owners[:, 0].tolist()):
        if runs and runs[-1][0] == owner:
            runs[-1] = (owner, runs[-1][1], position + 1)
        else:
            runs.append((owner, position, position + 1))
    if len({owner for owner, _, _ in runs}) != len(runs):
        return None  # a member's positions in two places: not one block of each
    pieces = []
    for owner, start, end in runs:
        rank = group[owner]
        block = result.narrow(dim, start, end - start) - owner * base
        stacked = end - start == 1 and block.dim() == len(shapes[rank]) + 1
        whole = _block_of(block.squeeze(dim), shapes[rank], torch) if stacked else None
        if whole is not None and whole[3]:
            # one position along a dim the source does not have: the whole value stacked there
            pieces.append(Piece(rank, sources[rank], dim - result.dim(), 0, 1, True, inserted=True))
            continue
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
