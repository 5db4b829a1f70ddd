"""Rules about permutations of dims (the families `shapes` and `layout`): the shape of a permuted
value, a permutation of a permutation, and elementwise ops whose other operand a permutation
leaves alone. See rules.py for the library and language.py for the permutation facts
(pmap, ptail, pcompose, pinverse) the encoder states.

A rank may permute a value the reference never permutes: Megatron's sequence parallelism puts
the sequence first (`partial.transpose(0, 1)`), reduce-scatters along it, adds the bias to its
block, gathers the blocks and transposes back. The reference's permuted value then exists only
as a term a rule makes (partial-permuted in rules_reductions.py makes the permutation of a
partial sum's value); these rules carry it to the end: the bias added to a block of the permuted
value is that block of the permuted sum, and the transpose back undoes the permutation.
"""

from __future__ import annotations

from .rules import Rule, registrar

PERMUTATION_RULES: list[Rule] = []


_rule = registrar(PERMUTATION_RULES)


_rule(
    "shape-permute-dim",
    "shapes",
    "output dim o of x.permute(p) is as long as x's dim p[o] (terms of permutations a rule makes)",
    "(rule ((= y (Permute x p)) (pmap p di do) (= n (sz x di))) ((set (sz y do) n)))",
)
_rule(
    "shape-permute-rank",
    "shapes",
    "a permutation keeps the number of dims",
    "(rule ((= y (Permute x p)) (= n (nd x))) ((set (nd y) n)))",
)
_rule(
    "permute-of-permute",
    "layout",
    "x.permute(p).permute(q) = x.permute(r) with r[o] = p[q[o]]: stated for a value that is a permutation "
    "only once the rules relate it (a rank's gathered blocks of a permuted value, permuted again)",
    "(rule ((= y (Permute x q)) (= x (Permute X p)) (pcompose p q r)) ((union y (Permute X r))))",
)
_rule(
    "permute-of-inverse",
    "layout",
    "x.permute(p).permute(q) = x when q undoes p (a transpose back)",
    "(rule ((= y (Permute x q)) (= x (Permute X p)) (pinverse p q)) ((union y X)))",
)

# f(X.permute(p), b) = f(X, b).permute(p) for an elementwise f when b broadcasts only along dims p
# leaves in place (b has no more dims than the tail p keeps: a bias along the hidden dim of a
# value whose batch and sequence dims are swapped). Both sides are the same function of the same
# elements: position i of the left reads X at p(i) and b at i's trailing coordinates, which p(i)
# shares. Stated where a rank applies f to the permuted value (or to a selection of it) and b, and
# the reference applies f to X and b: the reference's permuted result is made only then.
for _side, _rank_op, _rank_sel_op, _reference_op in (
    ("right", "(Bin f PX b)", "(Bin f x b)", "(Bin f X b)"),
    ("left", "(Bin f b PX)", "(Bin f b x)", "(Bin f b X)"),
):
    _rule(
        f"permute-then-broadcast-operand-{_side}",
        "layout",
        f"an elementwise op of a permuted value and an operand on the {_side} broadcast along the dims the "
        "permutation keeps in place is the permutation of the op's result",
        f"(rule ((= y {_rank_op}) (= PX (Permute X p)) (ptail p k) (= m (nd b)) (<= m k) (= Z {_reference_op})) "
        "((union y (Permute Z p))))",
    )
    _rule(
        f"selection-of-permute-then-broadcast-operand-{_side}",
        "layout",
        f"as permute-then-broadcast-operand-{_side}, where a rank applies the op to a selection of the permuted "
        "value (its block after a reduce-scatter along a permuted dim): the reference's permuted result is made",
        f"(rule ((= y {_rank_sel_op}) (sel PX x d R) (= PX (Permute X p)) (ptail p k) (= m (nd b)) (<= m k) "
        f"(= Z {_reference_op})) ((union {_rank_op} (Permute Z p))))",
    )
