"""Identities of operations with constants of known content, mixed into the Encoder (encode.py):
the operation is stated equal to what it leaves of its other operand.

- a fill whose mask is a constant with no position set is its input (`_fill_of_nothing`);
- scores plus a constant that is 0 or -inf everywhere are the scores filled with -inf there
  (`_additive_mask`);
- x + 0 and x - 0 are x for a constant made as zeros (`_plus_zeros`).

Each holds for every real x; checked on concrete tensors in tests/unit/test_sum_forms.py and the
attention-mask tests.
"""

from __future__ import annotations

from ..graph.model import Graph, Node
from .language import quoted as _q


class ConstantIdentities:
    """The Encoder provides `term`, `same_as`, `meta_of`, `commands`, `sums` and `_nodes_of`."""

    def state_constant_identities(self, graph: Graph, node: Node, name: str) -> None:
        if node.op == "binary" and node.attrs["fn"] == "add":
            self._additive_mask(graph, node, name)
        if node.op == "binary" and node.attrs["fn"] in ("add", "sub"):
            self._plus_zeros(graph, node, name)
        if node.op == "fill" and len(node.inputs) > 1:
            self._fill_of_nothing(graph, node, name)

    def _fill_of_nothing(self, graph: Graph, node: Node, name: str) -> None:
        """A fill whose mask is a constant with no position set leaves its input as it is (of
        the fill's own shape: a mask that only broadcasts it is a fill too). The rows of torch's
        safe softmax that no key is left for, under a causal mask (decompose.py)."""
        nodes = self._nodes_of(graph)
        mask = nodes.get(node.inputs[1])
        source = self.term(graph, node.inputs[0])
        if mask is not None and mask.attrs.get("sets_nothing") and self.meta_of[source].shape == node.meta.shape:
            self.commands.append(f"(union {name} {source})")

    def _plus_zeros(self, graph: Graph, node: Node, name: str) -> None:
        """x + 0 and x - 0 are x for every x (a bias made as zeros, broadcast): stated when x has
        the result's shape and dtype. Only constants made as zeros count (SumForms.zeros)."""
        operands = [self.term(graph, value) for value in node.inputs]
        if len(operands) != 2:
            return
        zero_at = [i for i, operand in enumerate(operands) if self.same_as(operand) in self.sums.zeros]
        for i in zero_at:
            if i == 0 and node.attrs["fn"] == "sub":
                continue  # 0 - x is -x
            kept = operands[1 - i]
            if kept in self.meta_of and self.meta_of[kept] == node.meta:
                self.commands.append(f"(union {name} {kept})")

    def _additive_mask(self, graph: Graph, node: Node, name: str) -> None:
        """Scores plus a constant that is 0 or -inf everywhere (an additive causal mask, Meta's
        Llama) are the scores filled with -inf where the constant is: x + 0 = x and x + -inf = -inf
        for every real x. Stated when the scores have the sum's shape (the mask broadcasts)."""
        nodes = self._nodes_of(graph)
        for mask_input, scores_input in ((1, 0), (0, 1)):
            mask = nodes.get(node.inputs[mask_input])
            where = mask.attrs.get("neg_inf_at") if mask is not None else None
            scores = self.term(graph, node.inputs[scores_input])
            if where and self.meta_of[scores].shape == node.meta.shape:
                self.commands.append(f'(union {name} (Fill {scores} (Const {_q(where)}) "-inf"))')
