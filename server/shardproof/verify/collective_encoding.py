"""Collectives lowered to the data-movement algebra over the matched calls of all ranks of their
group, mixed into the Encoder (encode.py): all-reduce, a sum over the multiset of the ranks'
inputs; all-gather, a concatenation in group order; reduce-scatter, a slice of the sum;
all-to-all, concatenations of slices; broadcast, the source's value. Calls the ranks do not agree
on are collective issues (a hang or a wrong result), and their results unrelated leaves."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from ..graph.model import Collective, Graph, Node, TensorMeta
from .blocking_hangs import blocking_hangs
from .language import quoted as _q
from .relayout import MOVEMENT_OPS, Exchange, Piece, fold, rows_sent

if TYPE_CHECKING:
    from .encode import Encoder


@dataclass
class CollectiveIssue:
    """Ranks of one group disagree on their collectives: a hang or a wrong result."""

    group: tuple[int, ...]
    index: int
    message: str
    nodes: list[tuple[str, str]]  # (graph name, node id)
    channel: int | None = None  # point-to-point calls: the sending rank (calls are matched per direction)
    hang: bool = False  # blocking calls waiting for each other (blocking_hangs.py), not a mismatch of calls


class CollectiveLowering:
    """The Encoder's collectives; uses its term plumbing (`let`, `term`, `core`, `commands`,
    `sums`, `_cat_halves`, `_nodes_of`, `same_as`) and its exchange state (`exchanges`, `_relayouts`,
    `_relayouts_stated`)."""

    def _lower(
        self,
        coll: Collective | None,
        group: tuple[int, ...],
        rank: int,
        calls: dict[int, Node],
        graphs: dict[int, Graph],
    ) -> str:
        assert coll is not None
        inputs = [self.term(graphs[r], calls[r].inputs[0]) for r in group]
        metas = [graphs[r].meta_of(calls[r].inputs[0]) for r in group]
        out_meta = calls[rank].meta
        op = coll.reduce_op or "sum"
        carries_factor = (
            coll.kind == "all_gather"
            or (coll.kind == "all_reduce" and op in ("sum", "avg"))
            or (coll.kind == "reduce_scatter" and op == "sum")
        )
        if self.factor_out and carries_factor:
            cores = [self.core(graphs[r], calls[r].inputs[0]) for r in group]
            # the ranks' values share a factor: it is the factor of their sum or concatenation
            # (an average's division by the group size joins it)
            factor = cores[0][1] / (len(group) if op == "avg" else 1)
            if factor != 1 and len({f for _, f in cores}) == 1:
                inputs = [t for t, _ in cores]
                op = "sum"
                self._collective_factors[(graphs[rank].name, calls[rank].id)] = factor
        if coll.kind == "all_reduce":
            collection = f"(multiset-of {' '.join(inputs)})"
            if op in ("sum", "avg"):
                for t in inputs:
                    self.commands.append(f"(arin {t})")
                total = f"(SumN {collection})"
                if not self.factor_out:  # (the sums' terms are not known as unscaled cores)
                    self.commands.extend(self.sums.total_facts(total, inputs))
                    self._coalesced(total, group, calls, graphs)
                return total if op == "sum" else self._scaled(total, Fraction(1, len(group)))
            if op not in ("max", "min"):
                return f"(Leaf {_q('unsupported reduction ' + op)})"
            for t in inputs:
                self.commands.append(f"(arin {t})")
            return f"({'MaxN' if op == 'max' else 'MinN'} {collection})"
        if coll.kind == "all_gather":
            nd = len(metas[0].shape)
            return self._inline_cat(inputs, metas, -nd)
        if coll.kind == "reduce_scatter":
            if (coll.reduce_op or "sum") != "sum":
                return f"(Leaf {_q('unsupported reduce_scatter ' + str(coll.reduce_op))})"
            for t in inputs:
                self.commands.append(f"(arin {t})")
            nd = len(out_meta.shape)
            chunk = out_meta.shape[0]
            index = group.index(rank)
            total = f"(SumN (multiset-of {' '.join(inputs)}))"
            if not self.factor_out:
                self.commands.extend(self.sums.total_facts(total, inputs))
            return f"(Slice {total} {-nd} {index * chunk} {(index + 1) * chunk})"
        if coll.kind in ("broadcast", "p2p"):
            # the source's value (a p2p send's own result is its token: the value it sent)
            assert coll.src is not None
            return self.term(graphs[coll.src], calls[coll.src].inputs[0])
        if coll.kind == "all_to_all":
            return self._all_to_all(group, rank, calls, graphs, inputs, metas)
        return f"(Leaf {_q('unsupported collective ' + coll.kind)})"

    def _coalesced(self, total: str, group: tuple[int, ...], calls: dict[int, Node], graphs: dict[int, Graph]) -> None:
        """An all-reduce of a buffer every rank concatenates alike (a coalesced all-reduce: values
        flattened into one buffer, reduced once) is the concatenation of the pieces' sums: a sum is
        elementwise, sum_r cat(a_r, b_r) = cat(sum_r a_r, sum_r b_r). Stated as a union, so each
        piece's sum is an all-reduce of its own (whatever relates the pieces' ranks' values)."""
        cats = [self._nodes_of(graphs[r]).get(calls[r].inputs[0]) for r in group]
        if any(c is None or c.op != "cat" for c in cats):
            return
        shapes = [[graphs[r].meta_of(v).shape for v in c.inputs] for r, c in zip(group, cats, strict=True)]
        dims = {c.attrs.get("dim", 0) % max(len(shapes[0][0]), 1) for c in cats if shapes[0]}
        if len(dims) != 1 or any(s != shapes[0] for s in shapes) or len(shapes[0]) < 2:
            return  # the ranks' buffers are not cut alike
        sums, metas = [], []
        for position in range(len(shapes[0])):
            pieces = [self.term(graphs[r], c.inputs[position]) for r, c in zip(group, cats, strict=True)]
            for t in pieces:
                self.commands.append(f"(arin {t})")
            piece_total = f"(SumN (multiset-of {' '.join(pieces)}))"
            self.commands.extend(self.sums.total_facts(piece_total, pieces))
            sums.append(piece_total)
            metas.append(graphs[group[0]].meta_of(cats[0].inputs[position]))
        dim = dims.pop() - len(shapes[0][0])  # negative, as the encoder writes a concatenation's dim
        self.commands.append(f"(union {total} {self._inline_cat(sums, metas, dim)})")

    def _inline_cat(self, parts: list[str], metas: list[TensorMeta], dim: int) -> str:
        if len(parts) == 1:
            return parts[0]
        left, right = self._cat_halves(parts, [m.shape for m in metas], dim, metas[0].dtype)
        return f"(Cat {left} {right} {dim})"

    def _all_to_all(
        self,
        group: tuple[int, ...],
        rank: int,
        calls: dict[int, Node],
        graphs: dict[int, Graph],
        inputs: list[str],
        metas: list[TensorMeta],
    ) -> str:
        receiver = group.index(rank)
        n = len(group)
        pieces: list[str] = []
        piece_metas: list[TensorMeta] = []
        for sender_index, sender in enumerate(group):
            coll = calls[sender].collective
            assert coll is not None
            meta = metas[sender_index]
            start, end = rows_sent(coll, meta.shape[0], n, receiver)
            nd = len(meta.shape)
            shape = (end - start, *meta.shape[1:])
            if start == 0 and end == meta.shape[0]:
                pieces.append(inputs[sender_index])
            else:
                pieces.append(self._moved_block(inputs[sender_index], -nd, start, end, TensorMeta(shape, meta.dtype)))
            piece_metas.append(TensorMeta(shape, meta.dtype))
        return self._inline_cat(pieces, piece_metas, -len(metas[0].shape))

    def relayout(self, graph: Graph, node: Node, name: str) -> None:
        """State what an exchange and the views / permutes after it computed, when it is a
        concatenation of blocks of the ranks' sources (see relayout.py)."""
        key = (graph.name, node.id)
        if key in self.exchanges:
            state = (self.exchanges[key], graph.rank or 0, [])
        elif node.op in MOVEMENT_OPS and node.inputs and all((graph.name, v) in self._relayouts for v in node.inputs):
            states = [self._relayouts[(graph.name, v)] for v in node.inputs]
            exchange, receiver = states[0][0], states[0][1]
            if any(other[0] is not exchange or other[1] != receiver for other in states):
                return  # movement of values from different exchanges: no one evaluation says it
            after = list({n.id: n for state in states for n in state[2]}.values())
            if len(after) >= 12:
                return
            state = (exchange, receiver, [*sorted(after, key=lambda n: self._order(graph, n)), node])
        else:
            return
        self._relayouts[key] = state
        for pieces, dim, perm in fold(*state):
            self._union_concatenation(name, node.meta, state[0], pieces, dim, perm)

    def _order(self, graph: Graph, node: Node) -> int:
        """A node's position in its graph (movement after an exchange is evaluated in this order)."""
        positions = self._positions.get(graph.name)
        if positions is None:
            positions = self._positions[graph.name] = {n.id: i for i, n in enumerate(graph.nodes)}
        return positions[node.id]

    def _union_concatenation(
        self,
        name: str,
        value_meta: TensorMeta,
        exchange: Exchange,
        pieces: list[Piece],
        dim: int,
        perm: tuple[int, ...] | None = None,
    ) -> None:
        """`name` (of `value_meta`'s shape) is the concatenation of `pieces` along `dim`, permuted by
        `perm`, viewed as that shape when it differs (relayout.fold's readings)."""
        terms, metas = [], []
        for piece in pieces:
            source_graph = exchange.graphs[piece.rank]
            source, meta = self.term(source_graph, piece.value), source_graph.meta_of(piece.value)
            if piece.inserted:
                # the whole value with a unit dim where the pieces are stacked: a view of it
                shape = list(meta.shape)
                shape.insert(len(shape) + 1 + piece.dim, 1)
                stacked = TensorMeta(tuple(shape), meta.dtype)
                terms.append(self._view(source, meta.shape, stacked))
                metas.append(stacked)
                continue
            if piece.whole:
                terms.append(source)
                metas.append(meta)
                continue
            shape = list(meta.shape)
            shape[len(shape) + piece.dim] = piece.end - piece.start
            block = TensorMeta(tuple(shape), meta.dtype)
            terms.append(self._moved_block(source, piece.dim, piece.start, piece.end, block))
            metas.append(block)
        concatenation = self._inline_cat(terms, metas, dim)
        shape = list(metas[0].shape)
        shape[len(shape) + dim] = sum(m.shape[len(shape) + dim] for m in metas)
        if perm is not None:  # the value is the concatenation permuted (relayout.fold)
            whole = self.let(self._fresh("a2acat"), concatenation, TensorMeta(tuple(shape), metas[0].dtype))
            concatenation = self.permutations.permute(whole, list(perm))
            shape = [shape[d] for d in perm]
        if tuple(shape) != tuple(value_meta.shape):  # and viewed: dims merged after the move (relayout)
            moved = self.let(self._fresh("a2amoved"), concatenation, TensorMeta(tuple(shape), metas[0].dtype))
            concatenation = self._view(moved, tuple(shape), value_meta)
        stated = (self.same_as(name), concatenation)
        if stated in self._relayouts_stated:
            # the same fact again: every rank's copy of an all-gathered value is one term (`let`),
            # and the slices it is cut into are the same concatenations on every rank (TP=64: 4,096
            # unions of the LM head's gather, 64 of them different)
            return
        self._relayouts_stated.add(stated)
        self.commands.append(f"(union {name} {concatenation})")

    def _moved_block(self, source: str, dim: int, start: int, end: int, meta: TensorMeta) -> str:
        """A slice of a rank's value that an exchange moves (the `a2a-piece` rules may relate it)."""
        term = self.let(self._fresh("a2a"), f"(Slice {source} {dim} {start} {end})", meta)
        self.commands.append(f"(a2a-piece {term})")
        return term


def _mismatch(
    group: tuple[int, ...], index: int, calls: dict[int, Node], graphs: dict[int, Graph]
) -> CollectiveIssue | None:
    members = [r for r in group if r in graphs]
    missing = [r for r in members if r not in calls]
    nodes = [(graphs[r].name, n.id) for r, n in calls.items()]
    absent = [r for r in group if r not in graphs]
    if absent:
        return CollectiveIssue(
            group,
            index,
            f"call {index + 1} of group {list(group)} names rank {absent[0]}, which does not exist in a world of "
            f"{len(graphs)}",
            nodes,
        )
    if missing:
        return CollectiveIssue(
            group,
            index,
            f"ranks {missing} of group {list(group)} make fewer collective calls "
            f"than the others: call {index + 1} is missing on them (a hang)",
            nodes,
        )
    kinds = {(n.collective.kind, n.collective.reduce_op) for n in calls.values() if n.collective}
    if len(kinds) > 1:
        described = ", ".join(f"rank {r}: {n.collective.kind}" for r, n in calls.items() if n.collective)
        return CollectiveIssue(
            group,
            index,
            f"collective call {index + 1} of group {list(group)} differs between ranks ({described})",
            nodes,
        )
    shapes = {graphs[r].meta_of(n.inputs[0]).shape for r, n in calls.items()}
    kind = next(iter(kinds))[0]
    if len(shapes) > 1 and kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        return CollectiveIssue(
            group,
            index,
            f"collective call {index + 1} of group {list(group)} has different "
            f"input shapes on different ranks: {sorted(shapes)}",
            nodes,
        )
    return None


def _unpaired(
    group: tuple[int, ...], index: int, calls: dict[int, Node], graphs: dict[int, Graph], sender: int
) -> CollectiveIssue | None:
    """The `index`-th value `sender` sends its peer, when the two ranks do not both make the call
    or move values of other shapes."""
    (receiver,) = [r for r in group if r != sender] or [sender]
    nodes = [(graphs[r].name, n.id) for r, n in calls.items()]
    if receiver not in graphs:
        return CollectiveIssue(
            group,
            index,
            f"rank {sender} sends to rank {receiver}, which does not exist in a world of {len(graphs)}",
            nodes,
            sender,
        )
    if sender not in calls or receiver not in calls:
        count = index + 1
        message = (
            f"rank {receiver} receives value {count} from rank {sender}, which sends fewer (a hang)"
            if sender not in calls
            else f"rank {sender} sends value {count} to rank {receiver}, which receives fewer (a hang or a lost value)"
        )
        return CollectiveIssue(group, index, message, nodes, sender)
    shapes = {graphs[r].meta_of(n.inputs[0]).shape for r, n in calls.items()}
    if len(shapes) > 1:
        return CollectiveIssue(
            group,
            index,
            f"value {index + 1} rank {sender} sends to rank {receiver} has another shape than the one it receives: "
            f"{sorted(shapes)}",
            nodes,
            sender,
        )
    return None


def encode_ranks(encoder: Encoder, graphs: list[Graph]) -> None:
    """Encode rank graphs in an order that respects collectives.

    A collective's lowered term needs the inputs of all ranks of its group, so each rank is
    encoded up to its next collective, the collectives whose inputs are all present are lowered,
    and the walk repeats. Calls that can never be matched become unrelated leaves.
    """
    hangs = blocking_hangs(graphs)
    encoder.issues.extend(CollectiveIssue(h.ranks, h.position, h.message, h.nodes, hang=True) for h in hangs)
    positions = {g.name: 0 for g in graphs}
    lowered: dict[tuple[str, str], str] = {}
    while True:
        progressed = False
        for graph in graphs:
            while positions[graph.name] < len(graph.nodes):
                node = graph.nodes[positions[graph.name]]
                name = encoder._name(graph.name, node.id)
                if node.collective is not None:
                    if (graph.name, node.id) not in lowered:
                        break
                    encoder.let_collective(graph, node, name, lowered[(graph.name, node.id)])
                else:
                    encoder.node_term(graph, node, name)
                encoder.bind(graph, node.id, name)
                encoder.relayout(graph, node, name)
                positions[graph.name] += 1
                progressed = True
        if all(positions[g.name] >= len(g.nodes) for g in graphs):
            return
        newly = _lower_ready(encoder, graphs, exclude=set(lowered))
        lowered.update(newly)
        if not newly and not progressed:
            for graph in graphs:
                if positions[graph.name] < len(graph.nodes):
                    node = graph.nodes[positions[graph.name]]
                    lowered[(graph.name, node.id)] = f"(Leaf {_q(graph.name + '/' + node.id)})"


def _lower_ready(encoder: Encoder, graphs: list[Graph], exclude: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Lower every matched collective call whose inputs are encoded on all its ranks."""
    by_rank = {g.rank: g for g in graphs}
    # Each group's calls are matched in order; point-to-point calls in order per direction (the
    # k-th value one rank sends another is the k-th it receives from it, however the two ranks
    # interleave their sends and receives: non-blocking calls in either order pair up).
    sequences: dict[tuple[tuple[int, ...], int | None, int], list[Node]] = {}
    for graph in graphs:
        for node in graph.nodes:
            coll = node.collective
            if coll is not None:
                channel = coll.src if coll.kind == "p2p" else None
                sequences.setdefault((coll.group, channel, graph.rank), []).append(node)  # type: ignore[arg-type]
    result: dict[tuple[str, str], str] = {}
    reported = {(i.group, i.channel, i.index) for i in encoder.issues if not i.hang}
    for group, channel in sorted({(g, c) for g, c, _ in sequences}, key=lambda gc: (gc[0], gc[1] is not None, gc[1])):
        members = [r for r in group if r in by_rank]
        lengths = {r: len(sequences.get((group, channel, r), [])) for r in members}
        for k in range(max(lengths.values(), default=0)):
            calls = {r: sequences[(group, channel, r)][k] for r in members if k < lengths[r]}
            if all((by_rank[r].name, n.id) in exclude for r, n in calls.items()):
                continue
            # a receive's input is only its buffer: the sender's value is what it needs
            needed = {r: n for r, n in calls.items() if channel is None or r == channel}
            if not all((by_rank[r].name, n.inputs[0]) in encoder.term_of for r, n in needed.items()):
                break
            if channel is None:
                issue = _mismatch(group, k, calls, by_rank)
            else:
                issue = _unpaired(group, k, calls, by_rank, channel)
            if issue is not None:
                if (group, channel, k) not in reported:
                    encoder.issues.append(issue)
                    reported.add((group, channel, k))
                for r, n in calls.items():
                    result[(by_rank[r].name, n.id)] = f"(Leaf {_q(by_rank[r].name + '/' + n.id)})"
                continue
            kind = next(iter(calls.values())).collective.kind  # type: ignore[union-attr]
            exchange = Exchange(kind, group, calls, by_rank) if kind in ("all_to_all", "all_gather") else None
            for r, n in calls.items():
                if exchange is not None:
                    encoder.exchanges[(by_rank[r].name, n.id)] = exchange
                result[(by_rank[r].name, n.id)] = encoder._lower(n.collective, group, r, calls, by_rank)
    return result
