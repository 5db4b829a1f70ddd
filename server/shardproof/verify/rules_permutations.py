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
# shares. Stated wherever a rank applies f to a permuted value and such a b (the permutation moves
# out, see the rules below); where it applies f to a selection of the permuted value, only when the
# reference applies f to X and b: the reference's permuted result is made only then.
for _side, _rank_op, _rank_sel_op, _reference_op in (
    ("right", "(Bin f PX b)", "(Bin f x b)", "(Bin f X b)"),
    ("left", "(Bin f b PX)", "(Bin f b x)", "(Bin f b X)"),
):
    _rule(
        f"permute-then-broadcast-operand-{_side}",
        "layout",
        f"an elementwise op of a permuted value and an operand on the {_side} broadcast along the dims the "
        "permutation keeps in place (a bias along the hidden dim) is the permutation of the op's result",
        f"(rule ((= y {_rank_op}) (= PX (Permute X p)) (ptail p k) (= m (nd b)) (<= m k)) "
        f"((union y (Permute {_reference_op} p))))",
    )
    _rule(
        f"selection-of-permute-then-broadcast-operand-{_side}",
        "layout",
        f"as permute-then-broadcast-operand-{_side}, where a rank applies the op to a selection of the permuted "
        "value (its block after a reduce-scatter along a permuted dim): the reference's permuted result is made",
        f"(rule ((= y {_rank_sel_op}) (sel PX x d R) (= PX (Permute X p)) (ptail p k) (= m (nd b)) (<= m k) "
        f"(= Z {_reference_op})) ((union {_rank_op} (Permute Z p))))",
    )

# A rank may compute on a permuted layout throughout: Megatron's sequence-first [seq, batch, hidden]
# against a batch-first reference, with one transpose on the way in and one on the way out. Every
# operation that maps positions to positions (elementwise ops), or works along dims a permutation
# leaves in place (a linear map over the last dim, a softmax or a kept-dim reduction over a trailing
# dim), gives the same entries on the permuted value, moved: f(X.permute(p)) = f(X).permute(p). The
# rules move the permutation outward, so the rank's value is the permutation of a term of the
# unpermuted value, which the reference's terms and the other rules relate; the transpose back
# then meets `permute-of-inverse`. Each rule makes one term of an operand without its permutation,
# so a chain of n operations on a permuted value makes n terms (nothing moves a permutation inward
# through these ops again, apart from scalings, which already do and meet the same terms).
_rule(
    "unary-of-permute",
    "layout",
    "f(x.permute(p)) = f(x).permute(p) for elementwise f",
    "(rewrite (Un f (Permute x p)) (Permute (Un f x) p))",
)
for _term, _kind in (("Sc", "float"), ("ScI", "integer")):
    _rule(
        f"scalar-of-permute-{_kind}",
        "layout",
        f"f(x.permute(p), c) = f(x, c).permute(p) for an elementwise op with a constant ({_kind})",
        f"(rewrite ({_term} f (Permute x p) c) (Permute ({_term} f x c) p))",
    )
_rule(
    "binary-of-permutes",
    "layout",
    "f(x.permute(p), z.permute(p)) = f(x, z).permute(p) for elementwise f: both operands have p's dims, and "
    "broadcasting pairs dims one by one, which p moves alike",
    "(rewrite (Bin f (Permute x p) (Permute z p)) (Permute (Bin f x z) p))",
)
_rule(
    "linear-of-permute",
    "layout",
    "x.permute(p) @ W^T = (x @ W^T).permute(p) when p leaves the last dim (the features) in place",
    "(rule ((= y (Linear PX w)) (= PX (Permute x p)) (ptail p k) (>= k 1)) ((union y (Permute (Linear x w) p))))",
)
_rule(
    "softmax-of-permute",
    "layout",
    "softmax(x.permute(p), d) = softmax(x, d).permute(p) when p leaves dim d (and the dims after it) in place",
    "(rule ((= y (Softmax PX d)) (= PX (Permute x p)) (ptail p k) (<= (- 0 d) k)) "
    "((union y (Permute (Softmax x d) p))))",
)
_rule(
    "reduction-of-permute",
    "layout",
    "a reduction along trailing dim d, keeping it, of x.permute(p) is that of x, permuted, when p leaves dim d "
    "(and the dims after it) in place",
    "(rule ((= y (Red f PX d 1)) (= PX (Permute x p)) (ptail p k) (<= (- 0 d) k)) "
    "((union y (Permute (Red f x d 1) p))))",
)
# A slice or a concatenation of permuted values is the permutation of the slice or concatenation
# along the dim the permutation brings there: a rank that transposed its input and then takes its
# block of the sequence (or gathers the blocks along it) holds a permutation of the reference's
# block, which the rules above carry through the block's operations.
_rule(
    "slice-of-permute",
    "layout",
    "x.permute(p)[a:b] along output dim do = x[a:b] along input dim di, permuted, where p brings di to do",
    "(rule ((= y (Slice PX do a b)) (= PX (Permute x p)) (pmap p di do)) ((union y (Permute (Slice x di a b) p))))",
)
_rule(
    "concat-of-permutes",
    "layout",
    "cat(a.permute(p), b.permute(p)) along output dim do = cat(a, b) along input dim di, permuted, where p "
    "brings di to do",
    "(rule ((= y (Cat PA PB do)) (= PA (Permute a p)) (= PB (Permute b p)) (pmap p di do)) "
    "((union y (Permute (Cat a b di) p))))",
)
