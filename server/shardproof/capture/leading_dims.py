"""Values flattened over their leading dims, computed on the unflattened value as well.

A program often merges a value's leading dims before working on it: logits [batch, seq, vocab]
viewed [tokens, vocab] for a loss, hidden states [batch, seq, hidden] viewed [tokens, hidden] for
a router. Another program computing the same function keeps the dims (Megatron's loss on
[seq, batch, vocab / p]), and the two never meet: a rank's max over its vocabulary shard of the
flattened logits, all-reduced, unsqueezed and subtracted from them, is the view of the
reference's shifted logits only through a chain of views no rule follows.

An operation that works position by position along the merged dim gives the same entries on the
unflattened value, viewed: f(x.view(N, *t)) = f(x).view(N, *t') for x of shape (*lead, *t) and
N = prod(lead), because row-major order keeps each merged index's entries together and f reads
each merged index on its own. Such operations are elementwise ops (with operands that broadcast
along the merged dim or are flattened alike), reductions, softmaxes, picks and ops along another
dim, a linear map over the last dim, views and permutations that keep the merged dim first, and
slices of another dim. A reduction over the merged dim itself is the reduction over the lead dims
one at a time, outermost first (a sum, max, min, product or logsumexp of the groups), and an
all-reduce adds position by position, so its result is flattened alike.

This pass adds, for each such operation, its twin on the unflattened values (a node `<id>.unflat`
at the same source line, computed from the twins of its inputs) and records in `Graph.view_twins`
that the node is the twin's view (the encoder states it): the program is kept as written, and the
chain also exists in the form the other program computes. Where a position-wise operation
combines a flattened value with one that is not (an all-reduce's result), the twin reads that
one viewed to the lead dims.
"""

from __future__ import annotations

import math

from ..graph.model import Graph, Node, TensorMeta

# views that drop a size-1 dim (an index taken, a squeeze) rather than merge dims
_DROPPING_A_DIM = ("aten::select", "aten::squeeze", "aten::unbind")

# the attributes of each position-wise op this pass twins; a node with any other attribute
# (a folded constant, a mask's facts) is left as it is
_ATTRIBUTES: dict[str, set[str]] = {
    "unary": {"fn", "approximate"},  # (gelu's approximation is a parameter of its function)
    "scalar": {"fn", "value"},
    "binary": {"fn"},
    "fill": {"value"},
    "where": set(),
    "reduce": {"fn", "dim", "keepdim"},
    "pick": {"dim"},
    "along": {"fn", "dim", "index", "args"},
    "softmax": {"dim"},
    "log_softmax": {"dim"},
    "linear": set(),
    "matmul": set(),
    "permute": {"perm"},
    "slice": {"dim", "start", "end"},
    "view": {"shape"},
}
# attributes that say where a node came from, not what it computes (kept on the twin)
_INFORMATIVE = {"within"}
_BROADCASTING = ("binary", "fill", "where")
_ALONG_A_DIM = ("reduce", "along", "softmax", "log_softmax", "slice")
# reductions whose value over the merged dim is that over the lead dims one at a time (a mean of
# equal-sized groups' means is the mean)
_NESTING_REDUCTIONS = ("sum", "mean", "amax", "amin", "prod", "logsumexp")

Lead = tuple[int, ...]


def unflatten_leading_dims(graph: Graph) -> None:
    """Add the twins to `graph` (see the module's docstring)."""
    _Pass(graph).run()


class _Pass:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.metas: dict[str, TensorMeta] = {p.id: p.meta for p in graph.placeholders}
        self.metas.update((n.id, n.meta) for n in graph.nodes)
        self.flat: dict[str, tuple[str, Lead]] = {}  # a value -> (its unflattened value, the lead dims)
        self.viewed: dict[tuple[str, Lead], str] = {}  # (a value, lead dims) -> its view to them
        self.nodes = graph.node_map()
        self.emitted: list[Node] = []

    def run(self) -> None:
        if not any(self._origin(n) for n in self.graph.nodes if n.op == "view"):
            return
        for node in self.graph.nodes:
            self.emitted.append(node)
            if node.op == "view" and node.inputs[0] in self.flat and self._unflattening(node):
                continue
            if node.op == "view" and node.inputs[0] not in self.flat and (lead := self._origin(node)):
                self.flat[node.id] = (node.inputs[0], lead)
            elif set(node.attrs) - _INFORMATIVE <= _ATTRIBUTES.get(node.op, set()) and node.collective is None:
                self._twin(node)
            self._all_reduced(node)
        self.graph.nodes = self.emitted

    def _unflattening(self, node: Node) -> bool:
        """A view of a flattened value back to its unflattened shape is that value."""
        source = self.flat[node.inputs[0]][0]
        if node.meta.shape != self.metas[source].shape:
            return False
        self.graph.view_twins[node.id] = source
        return True

    def _origin(self, node: Node) -> Lead | None:
        """The lead dims a view merges into its first dim, keeping the rest (None if it does not).
        Lead dims of size 1 count: a rank's one head of [batch, heads, ...] merged with the batch
        is the merge the reference makes of all its heads."""
        if node.original.startswith(_DROPPING_A_DIM):
            return None  # x[..., i] or a squeeze: a dim removed, not merged with another
        source, shape = self.metas[node.inputs[0]].shape, node.meta.shape
        k = len(source) - len(shape) + 1
        lead = source[:k]
        if k < 2 or not shape or source[k:] != shape[1:] or math.prod(lead) != shape[0]:
            return None
        return lead

    # -- the twins -----------------------------------------------------------------------------
    def _twin(self, node: Node) -> None:
        """Emit the node's twin on the unflattened values, when it has one."""
        flat_inputs = [self.flat[i] for i in node.inputs if i in self.flat]
        if not flat_inputs:
            return
        lead = flat_inputs[0][1]
        if any(other != lead for _, other in flat_inputs):
            return
        shape = node.meta.shape
        if node.op == "reduce" and self._merged_reduction(node, lead):
            return
        if node.op == "slice" and self._merged_slice(node, lead):
            return
        if not shape or shape[0] != math.prod(lead):
            return
        planned = self._plan(node, lead)
        if planned is None:
            return
        inputs, attrs = planned
        meta = TensorMeta((*lead, *shape[1:]), node.meta.dtype)
        twin = self._emit(node, f"{node.id}.unflat", node.op, inputs, attrs, meta)
        self.flat[node.id] = (twin, lead)
        self.graph.view_twins[node.id] = twin

    def _emit(self, like: Node, base: str, op: str, inputs: list[str], attrs: dict, meta: TensorMeta) -> str:
        """A new node computing `op` at `like`'s place in the source; its id."""
        node_id = self._fresh(base)
        node = Node(node_id, op, tuple(inputs), attrs, meta, like.site, like.module_path, like.module_type)
        node.original = like.original
        self.emitted.append(node)
        self.metas[node_id] = meta
        return node_id

    def _plan(self, node: Node, lead: Lead) -> tuple[list[str], dict] | None:
        """The twin's inputs and attributes, or None when the op is not position-wise here."""
        op, attrs, ndim = node.op, dict(node.attrs), node.meta.ndim
        first = node.inputs[0]
        if op in _BROADCASTING:
            inputs = [self._broadcast_operand(i, lead, ndim) for i in node.inputs]
            return None if None in inputs else ([i for i in inputs if i is not None], attrs)
        if first not in self.flat:
            return None
        source = self.flat[first][0]
        in_ndim = self.metas[first].ndim
        if op in ("unary", "scalar"):
            return [source], attrs
        if op in _ALONG_A_DIM:
            return ([source], attrs) if in_ndim + attrs["dim"] >= 1 else None
        if op == "pick":
            index = self._operand(node.inputs[1], lead, exact=True)
            return ([source, index], attrs) if index is not None and in_ndim + attrs["dim"] >= 1 else None
        if op == "linear":
            weight = node.inputs[1] if len(node.inputs) == 2 else None
            if in_ndim < 2 or weight is None or weight in self.flat:
                return None
            return [source, weight], attrs
        if op == "matmul":
            # rows @ W for a matrix W: (*lead, k) @ (k, n) is the same product at every position
            # (GPT-2's Conv1D: `addmm` on the tokens flattened to rows)
            matrix = node.inputs[1] if len(node.inputs) == 2 else None
            if in_ndim != 2 or matrix is None or matrix in self.flat or self.metas[matrix].ndim != 2:
                return None
            return [source, matrix], attrs
        if op == "permute":
            perm = [p % in_ndim for p in attrs["perm"]]
            if perm[0] != 0:
                return None
            extra = len(lead) - 1
            attrs["perm"] = list(range(len(lead))) + [p + extra for p in perm[1:]]
            return [source], attrs
        if op == "view":
            attrs["shape"] = [*lead, *node.meta.shape[1:]]
            return [source], attrs
        return None

    def _broadcast_operand(self, value: str, lead: Lead, ndim: int) -> str | None:
        """An operand of a broadcasting op whose result is flattened over `lead` (of `ndim` dims),
        as the unflattened result's operand."""
        meta = self.metas[value]
        if value in self.flat:
            return self.flat[value][0] if meta.ndim == ndim else None
        if meta.ndim < ndim:
            return value  # it broadcasts along the merged dim: along the lead dims alike
        return self._operand(value, lead, exact=False)

    def _operand(self, value: str, lead: Lead, exact: bool) -> str | None:
        """`value` viewed to the lead dims (its first dim the merged one, or of size 1 when not
        `exact`: broadcast along it)."""
        if value in self.flat:
            return self.flat[value][0] if self.flat[value][1] == lead else None
        meta = self.metas[value]
        if not meta.shape or meta.shape[0] not in ((math.prod(lead),) if exact else (math.prod(lead), 1)):
            return None
        first = lead if meta.shape[0] != 1 else (1,) * len(lead)
        key = (value, first)
        if key not in self.viewed:
            view_meta = TensorMeta((*first, *meta.shape[1:]), meta.dtype)
            producer = self.nodes.get(value) or Node(value, "", (), {}, meta)
            attrs = {"shape": list(view_meta.shape)}
            self.viewed[key] = self._emit(producer, f"{value}.unflat", "view", [value], attrs, view_meta)
        return self.viewed[key]

    def _all_reduced(self, node: Node) -> None:
        """An all-reduce adds its ranks' values position by position: of a flattened value, its
        result is flattened alike, and its view to the lead dims is what the ops after it read."""
        coll = node.collective
        if coll is None or coll.kind != "all_reduce" or not node.inputs or node.inputs[0] not in self.flat:
            return
        lead = self.flat[node.inputs[0]][1]
        if node.meta.shape != self.metas[node.inputs[0]].shape:
            return
        unflattened = self._operand(node.id, lead, exact=True)
        if unflattened is not None:  # the all-reduce keeps its input's shape: always viewable
            self.flat[node.id] = (unflattened, lead)

    def _merged_slice(self, node: Node, lead: Lead) -> bool:
        """A slice of the merged dim that is a box of the lead dims (one index of each dim before
        some lead dim j, a range of j, every index of the dims after it: a rank's whole sequences
        of flattened tokens, or its part of one sequence): its twin is the source sliced so, and
        flattened alike."""
        a = node.attrs
        first = node.inputs[0]
        if first not in self.flat or self.metas[first].ndim + a["dim"] != 0:
            return False
        start, end = a["start"], a["end"]
        for j in range(len(lead)):
            block = math.prod(lead[j + 1 :])
            group = block * lead[j]
            if start % block or end % block or start // group != (end - 1) // group:
                continue
            current = self.flat[first][0]
            for i in range(j + 1):
                within = math.prod(lead[i + 1 :])
                low = (start // within) % lead[i]
                high = low + 1 if i < j else low + (end - start) // block
                meta = self.metas[current]
                shape = list(meta.shape)
                shape[i] = high - low
                attrs = {**a, "dim": i - meta.ndim, "start": low, "end": high}
                step_meta = TensorMeta(tuple(shape), meta.dtype)
                current = self._emit(node, f"{node.id}.unflat", "slice", [current], attrs, step_meta)
            self.flat[node.id] = (current, tuple(self.metas[current].shape[: len(lead)]))
            self.graph.view_twins[node.id] = current
            return True
        return False

    def _merged_reduction(self, node: Node, lead: Lead) -> bool:
        """A reduction over the merged dim, without keeping it: its twin reduces the lead dims one
        at a time, outermost first, to the node's own shape (the twin is equal to it)."""
        a = node.attrs
        first = node.inputs[0]
        if first not in self.flat or a["keepdim"] or a["fn"] not in _NESTING_REDUCTIONS:
            return False
        if self.metas[first].ndim + a["dim"] != 0:
            return False
        current = self.flat[first][0]
        for _ in lead:
            meta = self.metas[current]
            step_meta = TensorMeta(meta.shape[1:], node.meta.dtype)
            current = self._emit(node, f"{node.id}.unflat", "reduce", [current], {**a, "dim": -meta.ndim}, step_meta)
        self.graph.view_twins[node.id] = current
        return True

    def _fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.metas:
            i += 1
            name = f"{base}{i}"
        return name
