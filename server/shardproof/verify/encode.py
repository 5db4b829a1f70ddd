"""Encode one verification unit (the reference and every rank) as egglog text.

Each graph value becomes a let-bound term named `$<graph>_<node>`; rank parameters become the
terms of their provenance expressions over reference parameters; collectives are lowered to the
data-movement algebra over the matched calls of all ranks of their group (all-reduce: a sum over
the multiset of rank inputs; all-gather: a concatenation in group order; reduce-scatter: a slice
of the sum; all-to-all: concatenations of slices; broadcast: the source's value). Shapes, and the
dim maps of views, permutations and expansions, are emitted as facts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..graph.model import Graph, Node, TensorMeta
from ..relations import expr as px
from .collective_encoding import CollectiveIssue, CollectiveLowering, encode_ranks
from .constant_blocks import constant_block_facts
from .constant_identities import ConstantIdentities
from .factored_terms import FactoredTerms
from .language import quoted as _q
from .layout_facts import broadcast_facts, composition_facts, expand_facts, permute_facts, view_facts
from .opaque_calls import _between_opaque_calls, collapse_opaque_chains, opaque_attrs, opaque_key, operand_terms
from .permutations import Permutations
from .relayout import Exchange
from .scalars import (
    fill_value,
    float_factor,
    integer_factor,
    integer_product_facts,
    product_fact,
    scalar_term,
    scaled_term,
)
from .sum_forms import SumForms
from .twins import MovementTwins

_SAFE = re.compile(r"[^A-Za-z0-9_]")
_MOST_FACTORS = 24  # float factors whose products are stated (pairs grow quadratically)

# ops whose dim maps are facts about their term's e-class (layout_facts.py): a value of one is
# never stated equal to a value made another way (one class, two sources, mixed dim maps)
_MOVEMENT_WITH_DIM_FACTS = ("view", "permute", "expand")


def _shape_text(shape: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(s) for s in shape)


@dataclass
class EncodedUnit:
    commands: list[str]
    term_of: dict[tuple[str, str], str] = field(default_factory=dict)  # (graph, value id) -> term name
    issues: list[CollectiveIssue] = field(default_factory=list)
    n_terms: int = 0
    # (graph, value id) -> the constant factor carried outside the value (joint graphs; 1 if absent)
    factors: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    # targets of opaque calls with derived laws (op_laws.py): rules follow them like any other op
    law_targets: frozenset[str] = frozenset()


def _joined(shapes: list[tuple[int, ...]], dim: int, dtype: str) -> TensorMeta:
    """The meta of the concatenation of values of `shapes` along `dim` (negative)."""
    shape = list(shapes[0])
    shape[len(shape) + dim] = sum(s[len(s) + dim] for s in shapes)
    return TensorMeta(tuple(shape), dtype)


class Encoder(FactoredTerms, CollectiveLowering, MovementTwins, ConstantIdentities):
    def __init__(self) -> None:
        self.commands: list[str] = []
        self.term_of: dict[tuple[str, str], str] = {}
        self.meta_of: dict[str, TensorMeta] = {}
        self._expr_terms: dict[px.Expr, str] = {}
        self._counter = 0
        self._names: dict[tuple[str, str], str] = {}
        self._taken: set[str] = set()
        self.factless: set[str] = set()  # terms given no shape or `node` facts (see encode_unit)
        self._let_terms: dict[tuple[str, tuple[int, ...], str], str] = {}  # (term, shape, dtype) -> name (`let`)
        self._same_as: dict[str, str] = {}  # a name let to an equal term's name -> that name
        self._fresh_names: set[str] = set()  # names made by `_fresh`
        self.dtypes: set[str] = set()
        self.issues: list[CollectiveIssue] = []
        # all-to-all / all-gather results and the views and permutes of them, per receiving rank
        self.exchanges: dict[tuple[str, str], Exchange] = {}
        self._relayouts: dict[tuple[str, str], tuple[Exchange, int, list[Node]]] = {}
        self._positions: dict[str, dict[str, int]] = {}
        # the relayouts stated, by the e-class named and its concatenation (see `_union_concatenation`)
        self._relayouts_stated: set[tuple[str, str]] = set()
        # Joint forward-backward graphs: constant factors are carried outside linear operations
        # (see `_factored`). (graph, value id) -> (unscaled term, factor) for values whose factor is not 1.
        self.factor_out = False
        self.scaled: dict[tuple[str, str], tuple[str, Fraction]] = {}
        self._collective_factors: dict[tuple[str, str], Fraction] = {}
        self.sums = SumForms()  # chains of additions as multisets of their terms (sum_forms.py)
        self._graph_nodes: dict[str, dict[str, Node]] = {}  # graph name -> its nodes by id
        self._view_sources: dict[str, str] = {}  # a term known to be a view of another -> that one (twins.py)
        self._permutations_stated: set[tuple[int, ...]] = set()
        self._factors: dict[str, float] = {}  # the float factors of scalings, by their term (rules_scalars.py)
        self._integer_factors: set[int] = set()  # the integer factors of scalings (`ScI` terms)
        # permutations of permutations and of repeats, stated as one (permutations.py)
        self.permutations = Permutations(self._permuted_term, self.commands.append)

    # -- term plumbing ------------------------------------------------------------------------------
    def _name(self, graph: str, value_id: str) -> str:
        """A unique egglog name: sanitising alone is not injective (fx's `stack_1` and the second
        part `stack.1` of fx's `stack` both become `stack_1`)."""
        key = (graph, value_id)
        name = self._names.get(key)
        if name is None:
            name = base = f"${_SAFE.sub('_', graph)}__{_SAFE.sub('_', value_id)}"
            suffix = 1
            while name in self._taken:
                suffix += 1
                name = f"{base}_v{suffix}"
            self._names[key] = name
            self._taken.add(name)
        return name

    def _fresh(self, hint: str, read_from_let: bool = True) -> str:
        """A new name; `read_from_let`: its users read it from what `let` returns (so an equal
        term let before stands for it with no command), else they use it as given."""
        self._counter += 1
        name = f"$t{self._counter}_{_SAFE.sub('_', hint)[:24]}"
        if read_from_let:
            self._fresh_names.add(name)
        return name

    def let(self, name: str, term: str, meta: TensorMeta) -> str:
        """Let `name` be `term`, with its shape facts; returns the name to build on. A term already
        let under another name with its facts is that name's e-class (egglog hash-conses terms):
        `name` is let to it, and the other name returned and bound (`bind`), so that terms built
        on it are equal text too (every rank's copy of one all-gather and all that is computed
        from it), and its facts are not stated again (egglog 13 spends 40-170 us on each command)."""
        key = (term, tuple(meta.shape), meta.dtype)
        known = self._let_terms.get(key)
        if known is not None and known != name:
            if name not in self._fresh_names:  # a fresh name is only ever read from what this returns
                self.commands.append(f"(let {name} {known})")
                self.meta_of[name] = meta
            self._same_as[name] = known
            return known
        self.commands.append(f"(let {name} {term})")
        self.meta_of[name] = meta
        if name in self.factless:
            return name
        self._let_terms[key] = name
        nd = len(meta.shape)
        self.commands.append(f"(set (nd {name}) {nd})")
        for i, size in enumerate(meta.shape):
            self.commands.append(f"(set (sz {name} {i - nd}) {size})")
        return name

    def same_as(self, name: str) -> str:
        """The name terms are built on for `name` (itself, unless `let` found its term let before)."""
        return self._same_as.get(name, name)

    def bind(self, graph: Graph, value_id: str, name: str) -> None:
        name = self.same_as(name)
        self.term_of[(graph.name, value_id)] = name
        if name not in self.factless:
            self.commands.append(f"(node {name} {_q(graph.name + '/' + value_id)})")

    def term(self, graph: Graph, value_id: str) -> str:
        return self.term_of[(graph.name, value_id)]

    # -- provenance expressions -----------------------------------------------------------------------
    def expr_term(self, expr: px.Expr, leaf_name: str) -> str:
        """Term for a provenance expression; unrelated leaves become a unique Leaf."""
        if expr in self._expr_terms and not isinstance(expr, px.Fresh | px.Opaque):
            return self._expr_terms[expr]
        meta = TensorMeta(tuple(expr.shape), expr.dtype)
        if isinstance(expr, px.ParamRef):
            name = self.let(self._fresh("param"), f"(Param {_q(expr.name)})", meta)
        elif isinstance(expr, px.Constant):
            name = self.let(self._fresh("const"), f"(Const {_q(expr.digest)})", meta)
            if getattr(expr, "zero", False):  # (a capture stored before the field: not known)
                self.sums.add_zero(self.same_as(name))
        elif isinstance(expr, px.Fresh | px.Opaque):
            return self.let(self._fresh("leaf"), f"(Leaf {_q(leaf_name)})", meta)
        elif isinstance(expr, px.SliceOf):
            src = self.expr_term(expr.source, leaf_name)
            name = self.let(self._fresh("slice"), f"(Slice {src} {expr.dim} {expr.start} {expr.end})", meta)
        elif isinstance(expr, px.CatOf):
            parts = [self.expr_term(p, leaf_name) for p in expr.parts]
            name = self._cat(parts, [p.shape for p in expr.parts], expr.dim, expr.dtype)
        elif isinstance(expr, px.ViewOf):
            src = self.expr_term(expr.source, leaf_name)
            name = self._view(src, tuple(expr.source.shape), meta)
            if tuple(expr.source.shape) != tuple(expr.shape):
                # the view back to the source's shape is the source: the term the rules need to see
                # a shard taken through a view (every k-th row) as a selection of the source itself
                back = self._view(name, tuple(expr.shape), TensorMeta(tuple(expr.source.shape), expr.dtype))
                self.commands.append(f"(union {back} {src})")
        elif isinstance(expr, px.PermuteOf):
            src = self.expr_term(expr.source, leaf_name)
            name = self._permute(src, list(expr.perm), meta)
        elif isinstance(expr, px.ExpandOf):
            src = self.expr_term(expr.source, leaf_name)
            name = self._expand(src, tuple(expr.source.shape), meta)
        elif isinstance(expr, px.CastOf):
            src = self.expr_term(expr.source, leaf_name)
            self.dtypes.add(expr.dtype)
            name = self.let(self._fresh("cast"), f"(Un {_q('cast_' + expr.dtype)} {src})", meta)
        elif isinstance(expr, px.ScaleOf):
            src = self.expr_term(expr.source, leaf_name)
            name = self._scale(src, expr.factor, meta)
        else:  # pragma: no cover - exhaustive over px.Expr
            raise TypeError(expr)
        self._expr_terms[expr] = name
        return name

    def _scaled(self, term: str, factor: Fraction) -> str:
        """factor * term; its integers join the factors whose products are stated (scintprod)."""
        for integer in (factor.numerator, factor.denominator):
            if integer != 1 and len(self._integer_factors) < _MOST_FACTORS:
                self._integer_factors.add(integer)
        return scaled_term(term, factor)

    def _scale(self, src: str, factor: Fraction, meta: TensorMeta) -> str:
        if factor == 1:
            return src
        if factor.numerator == 1 or factor.denominator == 1:
            return self.let(self._fresh("scale"), self._scaled(src, factor), meta)
        return self.let(self._fresh("scale"), f'(Sc "mul" {src} {_q(repr(float(factor)))})', meta)

    # -- structural helpers shared by graphs and provenance ------------------------------------------
    def _cat(self, parts: list[str], shapes: list[tuple[int, ...]], dim: int, dtype: str) -> str:
        """Binary concatenation, nested as a balanced tree (see `_cat_halves`)."""
        if len(parts) == 1:
            return parts[0]
        left, right = self._cat_halves(parts, shapes, dim, dtype)
        return self.let(self._fresh("cat"), f"(Cat {left} {right} {dim})", _joined(shapes, dim, dtype))

    def _cat_halves(self, parts: list[str], shapes: list[tuple[int, ...]], dim: int, dtype: str) -> tuple[str, str]:
        """The two operands of the outer binary concatenation of `parts` (at least two): the first
        half and the second, each concatenated the same way. A balanced tree is log n deep where
        a nested list is n deep, and the rules reach a piece of it (a slice of one rank's share of
        an all-gather of n ranks) one level per iteration: n iterations over an e-graph holding
        every rank's pieces was the cost of gathering over 64 ranks. Up to three parts it is the
        list's nesting (a, (b, c))."""
        middle = len(parts) // 2
        return (
            self._cat(parts[:middle], shapes[:middle], dim, dtype),
            self._cat(parts[middle:], shapes[middle:], dim, dtype),
        )

    def _view(self, src: str, src_shape: tuple[int, ...], meta: TensorMeta) -> str:
        name = self.let(self._fresh("view"), f"(View {src} {_q(_shape_text(meta.shape))})", meta)
        self.commands.extend(view_facts(name, src_shape, meta.shape))
        self.commands.append(f"(vshape {src} {_q(_shape_text(src_shape))})")
        return name

    def _permute(self, src: str, perm: list[int], meta: TensorMeta) -> str:
        name = self.let(self._fresh("perm"), f"(Permute {src} {_q(_shape_text(perm))})", meta)
        self._permutation_facts(perm)
        return name

    def _permutation_facts(self, perm: list[int]) -> None:
        """The dim map of a permutation, once per permutation (facts about it, not its terms)."""
        if tuple(perm) not in self._permutations_stated:
            self._permutations_stated.add(tuple(perm))
            self.commands.extend(permute_facts(perm))

    def _permuted_term(self, src: str, perm: list[int]) -> str:
        shape = self.meta_of[src].shape
        return self._permute(src, perm, TensorMeta(tuple(shape[p] for p in perm), self.meta_of[src].dtype))

    def _expand(self, src: str, src_shape: tuple[int, ...], meta: TensorMeta) -> str:
        name = self.let(self._fresh("expand"), f"(Expand {src} {_q(_shape_text(meta.shape))})", meta)
        self.commands.extend(expand_facts(name, src_shape, meta.shape))
        return name

    # -- graphs ---------------------------------------------------------------------------------------
    def add_placeholders(self, graph: Graph, values: dict[str, px.Expr]) -> None:
        # A placeholder nothing reads adds terms and no fact (the parameters of blocks that a
        # skeleton calls opaquely: thousands at 126 layers).
        used = {value for node in graph.nodes for value in node.inputs} | set(graph.outputs)
        for p in graph.placeholders:
            if p.id not in used:
                continue
            if p.kind == "input":
                name = self._name("input", p.target)
                if ("inputs", p.target) not in self.term_of:
                    self.let(name, f"(Input {_q(p.target)})", p.meta)
                    self.term_of[("inputs", p.target)] = name
                self.bind(graph, p.id, self.term_of[("inputs", p.target)])
                continue
            expr = values.get(p.target)
            if expr is None and p.digest is not None:  # a lifted constant: its value (capture/folding.py)
                self.bind(graph, p.id, self.let(self._fresh("const"), f"(Const {_q(p.digest)})", p.meta))
                continue
            if expr is None:
                expr = px.Fresh(
                    reason=f"{p.kind} {p.target} has no known value", shape=p.meta.shape, dtype=p.meta.dtype
                )
            self.bind(graph, p.id, self.expr_term(expr, f"{graph.name}/{p.target}"))

    def add_reference_nodes(self, graph: Graph) -> None:
        """The reference runs on one rank: its collectives (if any) are over a single rank."""
        for node in graph.nodes:
            name = self._name(graph.name, node.id)
            if node.collective is not None:
                if len(node.collective.group) <= 1:
                    self.bind(graph, node.id, self.term(graph, node.inputs[0]))
                    continue
                self.let(name, f"(Leaf {_q(graph.name + '/' + node.id)})", node.meta)
            else:
                self.node_term(graph, node, name)
            self.bind(graph, node.id, name)

    def node_term(self, graph: Graph, node: Node, name: str, ins: list[str] | None = None) -> None:
        """Let `name` be the node's term: of its inputs' terms, or (`ins`) of other terms
        standing for them (the unscaled terms of `_factored`). A value the capture computed
        from constants alone (capture/folding.py) is also that constant: equal constants are
        one value, whatever operations made them (except a view, permutation or expansion, whose
        dim facts belong to how it was made: the values computed from it are stated instead)."""
        self._node_term(graph, node, name, ins)
        if ins is not None:
            return
        folded = node.attrs.get("folded")
        if folded and node.op not in _MOVEMENT_WITH_DIM_FACTS:
            self.commands.append(f"(union {name} (Const {_q(folded)}))")
        self.state_constant_identities(graph, node, name)

    def _nodes_of(self, graph: Graph) -> dict[str, Node]:
        """A graph's nodes by id (built once per graph)."""
        nodes = self._graph_nodes.get(graph.name)
        if nodes is None:
            nodes = self._graph_nodes[graph.name] = graph.node_map()
        return nodes

    def _node_term(self, graph: Graph, node: Node, name: str, ins: list[str] | None = None) -> None:
        own_inputs = ins is None
        if ins is None:
            if self.factor_out and self._factored(graph, node, name):
                return
            ins = [self.term(graph, i) for i in node.inputs]
        a = node.attrs
        meta = node.meta
        op = node.op
        if op == "slice":
            self.let(name, f"(Slice {ins[0]} {a['dim']} {a['start']} {a['end']})", meta)
            if own_inputs and not self.factor_out:
                self._slice_of_view_twin(node, name, ins[0])
        elif op == "cat":
            shapes = [self.meta_of[i].shape for i in ins]
            left, right = self._cat_halves(ins, shapes, a["dim"], meta.dtype)
            self.let(name, f"(Cat {left} {right} {a['dim']})", meta)
        elif op == "view":
            self.let(name, f"(View {ins[0]} {_q(_shape_text(meta.shape))})", meta)
            if own_inputs and not self.factor_out and ins[0] in self.meta_of:
                self.sums.note_view(self.same_as(name), ins[0], _shape_text(meta.shape), self.meta_of[ins[0]])
            if ins[0] in self.sums.zeros:
                self.sums.add_zero(self.same_as(name))  # a view of zeros is zeros
            self.commands.extend(view_facts(name, self.meta_of[ins[0]].shape, meta.shape))
            self.commands.append(f"(vshape {ins[0]} {_q(_shape_text(self.meta_of[ins[0]].shape))})")
            for source, dim, times in self._repeat_patterns(graph, node) if own_inputs else ():
                # The chain is repeat_interleave: state the identity so the repeat rules apply.
                self.commands.append(f"(union {name} (Rep {self.term(graph, source)} {dim} {times}))")
                self.permutations.note_repeat(self.same_as(name), self.term(graph, source), dim, times)
            if own_inputs and not self.factor_out:
                self._view_of_view_twin(name, ins[0], meta)
        elif op == "permute":
            self.let(name, f"(Permute {ins[0]} {_q(_shape_text(a['perm']))})", meta)
            self._permutation_facts(list(a["perm"]))
            self.permutations.note_permute(self.same_as(name), ins[0], list(a["perm"]))
            if own_inputs and not self.factor_out and ins[0] in self.meta_of:
                self.sums.note_permute(self.same_as(name), ins[0], _shape_text(a["perm"]), self.meta_of[ins[0]])
        elif op == "expand":
            self.let(name, f"(Expand {ins[0]} {_q(_shape_text(meta.shape))})", meta)
            self.commands.extend(expand_facts(name, self.meta_of[ins[0]].shape, meta.shape))
            self.commands.extend(broadcast_facts(name, self.meta_of[ins[0]].shape, meta.shape))
        elif op == "unary":
            fn = a["fn"]
            if fn.startswith("cast_"):
                self.dtypes.add(fn.removeprefix("cast_"))
            self.let(name, f"(Un {_q(fn)} {ins[0]})", meta)
        elif op == "scalar":
            self.let(name, scalar_term(a["fn"], ins[0], a["value"]), meta)
            factor = float_factor(a["fn"], a["value"])
            if factor is not None and len(self._factors) < _MOST_FACTORS:
                self._factors.setdefault(scalar_term("mul", "x", factor), factor)
            integer = integer_factor(a["fn"], a["value"])
            if integer is not None and len(self._integer_factors) < _MOST_FACTORS:
                self._integer_factors.add(integer)
        elif op == "binary":
            self.let(name, f"(Bin {_q(a['fn'])} {ins[0]} {ins[1]})", meta)
            if a["fn"] == "add" and own_inputs and not self.factor_out and all(i in self.meta_of for i in ins):
                self.sums.note_addition(self.same_as(name), ins, [self.meta_of[i] for i in ins], meta)
            if own_inputs and not self.factor_out:
                self._broadcast_twin(name, a["fn"], ins, meta)
        elif op == "where":
            self.let(name, f"(Where {ins[0]} {ins[1]} {ins[2]})", meta)
        elif op == "fill":
            self.let(name, f"(Fill {ins[0]} {ins[1]} {_q(fill_value(a['value']))})", meta)
        elif op == "reduce":
            reduced = self.let(name, f"(Red {_q(a['fn'])} {ins[0]} {a['dim']} {1 if a['keepdim'] else 0})", meta)
            if own_inputs:
                self._kept_twin(reduced, a["fn"], ins[0], a["dim"], a["keepdim"], meta)
                if not self.factor_out:
                    self._reduce_of_view_twin(reduced, a["fn"], ins[0], a["dim"], a["keepdim"], meta)
        elif op == "softmax":
            self.let(name, f"(Softmax {ins[0]} {a['dim']})", meta)
        elif op == "along":
            key = f"{a['fn']}#{a['index']}"
            self.let(name, f"(Along {_q(key)} {ins[0]} {a['dim']} {_q(json.dumps(a['args']))})", meta)
        elif op == "log_softmax":
            self.let(name, f"(LogSoftmax {ins[0]} {a['dim']})", meta)
        elif op == "linear":
            self.let(name, f"(Linear {ins[0]} {ins[1]})", meta)
        elif op == "matmul":
            self.let(name, f"(Matmul {ins[0]} {ins[1]})", meta)
        elif op == "embedding":
            self.let(name, f"(Emb {ins[0]} {ins[1]})", meta)
        elif op == "pick":
            self.let(name, f"(Pick {ins[0]} {ins[1]} {a['dim']})", meta)
        elif op == "sdpa":
            attrs = _q(json.dumps({k: a.get(k) for k in ("enable_gqa", "is_causal", "scale")}, sort_keys=True))
            if len(ins) == 4:
                self.let(name, f"(SdpaMask {ins[0]} {ins[1]} {ins[2]} {ins[3]} {attrs})", meta)
            else:
                self.let(name, f"(Sdpa {ins[0]} {ins[1]} {ins[2]} {attrs})", meta)
        elif op == "constant":
            self.let(name, f"(Const {_q(a['digest'])})", meta)
            if a.get("zero"):
                self.sums.add_zero(self.same_as(name))
        elif op == "uninitialized":
            self.let(name, f"(Leaf {_q(graph.name + '/' + node.id)})", meta)
        else:
            self.generic(graph, node, name, ins)

    def let_collective(self, graph: Graph, node: Node, name: str, lowered: str) -> None:
        factor = self._collective_factors.get((graph.name, node.id))
        if factor is None:
            self.let(name, lowered, node.meta)
            return
        core = self.let(self._fresh("core"), lowered, node.meta)
        self._state_scaled(graph, node, name, core, factor)

    def generic(self, graph: Graph, node: Node, name: str, ins: list[str]) -> None:
        key, attrs = opaque_key(node), opaque_attrs(node)
        meta = node.meta
        if not ins:
            self.let(name, f"(Op0 {key} {attrs})", meta)
        else:
            operands = operand_terms(ins)
            self.let(name, f"(Op{len(operands)} {key} {' '.join(operands)} {attrs})", meta)

    def _repeat_patterns(self, graph: Graph, node: Node) -> list[tuple[str, int, int]]:
        """view(expand(view(x))) that repeats every slice of one dim m times (repeat_interleave).

        Returns every (source, dim, m) reading of the chain: with m = 1 (no expansion) a unit dim
        of x makes the repeated dim ambiguous, and each reading is the identity.
        """
        nodes = graph.node_map()
        middle = nodes.get(node.inputs[0])
        expanded = None
        if middle is not None and middle.op == "expand":
            expanded = middle
            middle = nodes.get(middle.inputs[0])
        if middle is None or middle.op != "view":
            return []
        source = middle.inputs[0]
        x_shape = graph.meta_of(source).shape
        inserted = middle.meta.shape
        out = node.meta.shape
        if len(inserted) != len(x_shape) + 1 or len(out) != len(x_shape):
            return []
        readings = []
        for position in range(1, len(inserted)):
            if inserted[position] != 1 or inserted[:position] + inserted[position + 1 :] != x_shape:
                continue
            times = 1
            if expanded is not None:
                grown = expanded.meta.shape
                if grown[:position] + grown[position + 1 :] != x_shape:
                    continue
                times = grown[position]
            merged = list(x_shape)
            merged[position - 1] *= times
            if tuple(merged) == out:
                readings.append((source, (position - 1) - len(x_shape), times))
        return readings

    def _composition_facts(self) -> list[str]:
        """How every permutation the programs apply composes with every other of the same length
        (the layout rules follow a permutation of a value that is, after saturation, a permutation
        itself). Composed permutations get their dim facts once, but are not composed again."""
        facts: list[str] = []
        stated = sorted(self._permutations_stated)
        described = set(stated)
        for first in stated:
            for then in stated:
                if len(first) != len(then):
                    continue
                composed = tuple(first[i] for i in then)
                found = composition_facts(list(first), list(then))
                if composed in described:
                    found = found[:1]
                described.add(composed)
                facts.extend(found)
        return facts

    def _product_facts(self) -> list[str]:
        """Scaling by a then by b is scaling by a * b, for every two float factors of the programs
        (a value scaled twice once the scalings of its operands are moved to it: rules_scalars.py)."""
        factors = list(self._factors.values())
        facts = [product_fact(first, then) for first in factors for then in factors]
        facts += integer_product_facts(sorted(self._integer_factors))
        return [fact for fact in facts if fact is not None]

    def finish(self) -> EncodedUnit:
        from .rules import casts_are_linear

        self.commands.extend(self._composition_facts())
        self.commands.extend(self._product_facts())
        self.commands.append(casts_are_linear(self.dtypes))
        self.commands.extend(self.sums.chain_facts())
        factors = {key: factor for key, (_, factor) in self.scaled.items()}
        # a fact stated again is the same fact (every rank states what an all-reduce's inputs
        # are); a `let` is never repeated (each name is let once)
        commands = list(dict.fromkeys(self.commands))
        return EncodedUnit(commands, self.term_of, self.issues, len(self.meta_of), factors)


def encode_unit(
    reference: Graph,
    reference_values: dict[str, px.Expr],
    ranks: list[tuple[Graph, dict[str, px.Expr]]],
    outputs_only: bool = False,
    call_laws: tuple[str, ...] = (),
) -> EncodedUnit:
    """Encode the reference and all ranks of one world size into one program.

    `call_laws`: rules of opaque calls proven elsewhere (block_contracts.py), added to the unit;
    they match calls one by one, so no chain of calls is collapsed in such a unit.

    With `outputs_only` (a unit whose verdict reads nothing but its outputs' relations), every
    chain of opaque calls is one call (`collapse_opaque_chains`), and a value an opaque call
    computes only for other opaque calls gets no shape or `node` facts: opaque calls have no rules
    but congruence, so no rule could use its shape, and no one reads its relations. A memoized
    skeleton is such a chain (one call per layer, in every program), and egglog 13 spends 40-170
    us on every command, whatever it is."""
    from .op_laws import laws_for
    from .opaque_rules import opaque_forms

    encoder = Encoder()
    laws = laws_for(reference, opaque_forms())
    # the backward of a joint graph is linear in its seed: carry constant factors (see Encoder._factored)
    encoder.factor_out = any(role is not None for role in reference.gradient_roles)
    if outputs_only:
        if not call_laws:
            reference = collapse_opaque_chains(reference)
            ranks = [(collapse_opaque_chains(graph), values) for graph, values in ranks]
        for graph in [reference, *(g for g, _ in ranks)]:
            between = _between_opaque_calls(graph, laws.targets)
            encoder.factless.update(encoder._name(graph.name, value) for value in between)
    encoder.add_placeholders(reference, reference_values)
    encoder.add_reference_nodes(reference)
    for graph, values in ranks:
        encoder.add_placeholders(graph, values)
    encode_ranks(encoder, [g for g, _ in ranks])
    for graph in [reference, *(g for g, _ in ranks)]:
        encoder.state_view_twins(graph)
    encoder.commands.extend(constant_block_facts(encoder, reference, [g for g, _ in ranks]))
    encoder.commands.extend(laws.rules)
    encoder.commands.extend(call_laws)
    unit = encoder.finish()
    unit.law_targets = laws.targets
    return unit
