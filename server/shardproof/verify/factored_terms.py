"""Constant factors carried outside the values of joint forward-backward graphs, mixed into the
Encoder (encode.py): a backward pass is linear in its seed, so every gradient is a constant times
what it would be from another seed (see `FactoredTerms._factored`)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from ..graph.model import Graph, Node
from .language import quoted as _q
from .scalars import fill_value

SCALED_SUFFIX = "#unscaled"


# ops linear in every input (the factor is the product of the inputs' factors) and ops linear in
# their first input whose other inputs must be unscaled (indices, masks)
_MULTILINEAR = {"linear", "matmul"}
_LINEAR_IN_FIRST = {"view", "permute", "expand", "slice", "pick"}
_LINEAR_GENERIC = {"aten::embedding_dense_backward"}


def _additive(node: Node) -> bool:
    return (node.op == "binary" and node.attrs["fn"] in ("add", "sub")) or node.op == "cat"


def _linear_factor(node: Node, factors: list[Fraction]) -> Fraction | None:
    """The factor of a linear operation's result from its inputs' factors; None if it is not linear
    in the scaled inputs (the scaled values are then used as they are)."""
    op, a = node.op, node.attrs
    first, rest = factors[0], factors[1:]
    if op in _MULTILINEAR or (op == "binary" and a["fn"] == "mul"):
        return math.prod(factors, start=Fraction(1))
    if op == "binary" and a["fn"] == "div":
        return first / factors[1]
    if _additive(node):
        return first
    unscaled_rest = all(f == 1 for f in rest)
    if op in _LINEAR_IN_FIRST and unscaled_rest:
        return first
    if (op == "reduce" and a["fn"] == "sum") or (op == "scalar" and a["fn"] in ("mul", "div")):
        return first
    if op == "unary" and (a["fn"] == "neg" or a["fn"].startswith("cast_float") or a["fn"].startswith("cast_bfloat")):
        return first
    if op == "fill" and unscaled_rest and fill_value(a["value"]) == "0.0":
        return first
    if op == "generic" and a.get("target") in _LINEAR_GENERIC and a.get("index", 0) == 0 and unscaled_rest:
        return first
    return None


class FactoredTerms:
    """The Encoder's constant factors (joint graphs); uses its term plumbing (`let`, `term`,
    `node_term`, `meta_of`, `commands`) and its `scaled` map."""

    def core(self, graph: Graph, value_id: str) -> tuple[str, Fraction]:
        """A value as (term, factor): the value is factor * term."""
        return self.scaled.get((graph.name, value_id)) or (self.term(graph, value_id), Fraction(1))

    def _factored(self, graph: Graph, node: Node, name: str) -> bool:
        """Encode `node` as a constant factor times an unscaled term when it is linear in its scaled
        inputs (or is itself a division or multiplication by an integer, or a mean), and state
        its value as that product. False: no factor to carry (encode as usual).

        A backward pass is linear in its seed, so every gradient is a constant times what it
        would be from another seed: a data-parallel rank seeds backward with the mean over its
        batch block (1/n where the reference has 1/N), averages its gradients (/ world size),
        accumulates micro-batches (each loss / their number). Carried as factors, these constants
        meet (1/n / world size = 1/N) and the unscaled terms relate as selections and partial sums
        of the reference's, with the usual rules. Every step is an identity: f(c x) = c f(x) for
        f linear in x, c x + c y = c (x + y), mean = sum / count."""
        cores = [self.core(graph, i) for i in node.inputs]
        factors = [f for _, f in cores]
        terms = [t for t, _ in cores]
        op, a = node.op, node.attrs
        if op == "scalar" and a["fn"] in ("mul", "div"):
            value = a["value"]
            integral = isinstance(value, int | float) and not isinstance(value, bool) and float(value).is_integer()
            if integral and value != 0:
                c = Fraction(int(value))
                self._state_scaled(graph, node, name, terms[0], factors[0] * c if a["fn"] == "mul" else factors[0] / c)
                return True
        if op == "scalar" and a["fn"] in ("add", "sub") and a["value"] == 0 and not isinstance(a["value"], bool):
            # x + 0 (Python's sum() of losses starts at 0)
            self._state_scaled(graph, node, name, terms[0], factors[0])
            return True
        if op == "reduce" and a["fn"] == "mean":
            count = self.meta_of[terms[0]].shape[a["dim"]]
            summed = dataclasses.replace(node, attrs={**a, "fn": "sum"})
            core = self._fresh("core", read_from_let=False)
            self.node_term(graph, summed, core, ins=[terms[0]])
            self._state_scaled(graph, node, name, core, factors[0] / count)
            return True
        if all(f == 1 for f in factors):
            return False
        factor = _linear_factor(node, factors)
        if factor is None:
            return False
        if _additive(node):
            # c x + d y = c (x + (d / c) y): the ratios of the operands' factors are the same in
            # every program that computes the same sum, the common factor is what differs
            for i, f in enumerate(factors[1:], start=1):
                if f != factor:
                    meta = self.meta_of[terms[i]]
                    terms[i] = self.let(self._fresh("ratio"), self._scaled(terms[i], f / factor), meta)
        core = self._fresh("core", read_from_let=False)
        self.node_term(graph, node, core, ins=terms)
        self._state_scaled(graph, node, name, core, factor)
        return True

    def _state_scaled(self, graph: Graph, node: Node, name: str, core: str, factor: Fraction) -> None:
        self.let(name, self._scaled(core, factor), node.meta)
        if factor != 1:
            self.scaled[(graph.name, node.id)] = (core, factor)
            # the unscaled value's relations are read back under the node's id + SCALED_SUFFIX
            self.commands.append(f"(node {core} {_q(graph.name + '/' + node.id + SCALED_SUFFIX)})")
