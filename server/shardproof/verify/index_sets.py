"""Rules for shards that are index sets, not one contiguous block: every k-th row (`W[rank::ws]`,
hidden units dealt round-robin), or any list of ranges a selection holds.

A strided shard reaches the e-graph as data movement (the span viewed as (n, k), one offset of
the k sliced, the unit dim merged away; capture/provenance.py). `view-merge-inner-selection`
turns a selection of the inner dim of such a merge into the ranges it takes of the merged dim:
every k-th index is the list (r, r+1), (r+k, r+k+1), ... (`RTile`).

A contraction over a selection of several ranges is the contribution of that index set to the
reduction: `(psumi X x R K)` says x is the sum, over the indices the range list R names, of
their contributions to X, a reduction over K indices. The ranks' contributions reach X through
an all-reduce when their index sets partition [0, K). That is checked by merging the sets in
order of their smallest index: each set must start where the ranks so far stop covering
(`RUnion` merges two ascending lists and gets stuck on an overlap), and the cover is complete
when the merged list is the one range [0, K).

Contiguous shards keep the cheaper `psum` (one range [s, e)); these rules fire only for lists of
two ranges or more.
"""

from __future__ import annotations

from .rules import Rule, registrar

INDEX_SET_RULES: list[Rule] = []


_rule = registrar(INDEX_SET_RULES)


# Two ranges or more: a one-range list is a contiguous block, which `psum` handles.
_SEVERAL = "(= R (RCons s1 e1 (RCons s2 e2 t)))"

# ---------------------------------------------------------------------------------------------
# range lists: tiling a selection over the outer dim of a merge, merging ascending lists
# ---------------------------------------------------------------------------------------------
_rule("range-tile-none", "ranges", "no copies of a selection select nothing", "(rewrite (RTile r h 0) (RNil))")
_rule(
    "range-tile-more",
    "ranges",
    "m copies of a selection, the i-th shifted by i * h: the first m - 1 copies, then the last",
    "(rewrite (RTile r h m) (RApp (RTile r h (- m 1)) (RShift r (* (- m 1) h))) :when ((> m 0)))",
)
_rule("range-union-left-empty", "ranges", "merging nothing into r gives r", "(rewrite (RUnion (RNil) r) r)")
_rule("range-union-right-empty", "ranges", "merging r with nothing gives r", "(rewrite (RUnion r (RNil)) r)")
_rule(
    "range-union-left-first",
    "ranges",
    "merging two ascending lists: the first range of the left one comes first when it ends before the right "
    "one's first range starts",
    "(rewrite (RUnion (RCons a b t) (RCons c d u)) (RCons a b (RUnion t (RCons c d u))) :when ((<= b c)))",
)
_rule(
    "range-union-right-first",
    "ranges",
    "merging two ascending lists: the first range of the right one comes first when it ends before the left "
    "one's first range starts (overlapping ranges merge no further)",
    "(rewrite (RUnion (RCons a b t) (RCons c d u)) (RCons c d (RUnion (RCons a b t) u)) :when ((<= d a)))",
)
_rule(
    "range-ascending-last",
    "ranges",
    "one non-empty range is ascending",
    "(rule ((= r (RCons s e (RNil))) (< s e)) ((ascending r)))",
)
_rule(
    "range-ascending-cons",
    "ranges",
    "a non-empty range ending at or before the start of an ascending list is ascending with it",
    "(rule ((= r (RCons s e t)) (= t (RCons s2 e2 t2)) (< s e) (<= e s2) (ascending t)) ((ascending r)))",
)

_rule(
    "range-tiled-two",
    "ranges",
    "two ranges of one length, h apart, are two copies of the first with period h",
    "(rule ((= r (RCons s e (RCons s2 e2 (RNil)))) (< s e) (< e s2) (= (- s2 s) (- e2 e))) ((tiled r s e (- s2 s) 2)))",
)
_rule(
    "range-tiled-more",
    "ranges",
    "a range h before m copies of a range of its length with period h makes m + 1 copies",
    "(rule ((= r (RCons s e t)) (tiled t s2 e2 h m) (= h (- s2 s)) (= h (- e2 e)) (< e s2)) ((tiled r s e h (+ m 1))))",
)

# ---------------------------------------------------------------------------------------------
# layout: every k-th index, seen in the merged dim
# ---------------------------------------------------------------------------------------------
_rule(
    "view-merge-inner-selection",
    "layout",
    "merging dims (m, h) into one: a selection R of the inner dim takes R + i * h of the merged dim for every "
    "outer index i (every other row of a weight viewed as (rows / 2, 2) is the ranges 0, 2, 4, ...)",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x dj R) (vmerge Y di do h k sX) (vmerge y di do n k sx) "
    "(vshape X sX) (vshape x sx) "
    "(= dj (+ di 1)) (= h (sz X dj)) (= n (sz x dj)) (= m (sz X di)) (= m (sz x di))) "
    "((selp Y y do (RTile R h m))))",
)

_rule(
    "view-split-tiled-selection",
    "layout",
    "splitting a dim into two, (m, h): the ranges R + i * h for every outer index i are the selection R of the "
    "inner dim (heads merged into the batch dim for bmm, then split again; R lies within [0, h) because the last "
    "copy ends inside the dim; a split into more dims has an inner product h larger than the next dim), when "
    "the selection is split alike, into (m, |R|) (split into other sizes, its rows are no rows of the value's)",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di RT) (tiled RT s e h m) "
    "(vsplit Y di do h k sX) (vsplit y di do n k sx) (vshape X sX) (vshape x sx) (= m (sz Y do)) "
    "(= h (sz Y (+ do 1))) (= n (- e s))) "
    "((sel Y y (+ do 1) (RCons s e (RNil)))))",
)

_rule(
    "view-split-tiled-selection-in-three",
    "layout",
    "splitting a dim into three, (m, h1, h2): the ranges R + i * h for every outer index i (h = h1 h2, R a whole "
    "number of h2-runs) are the selection R / h2 of the middle dim (keys and values concatenated per rank, "
    "viewed as (2, heads, head_dim)), when the selection is split alike, into (m, |R| / h2, h2)",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di RT) (tiled RT s e h m) "
    "(vsplit Y di do h k sX) (vsplit y di do n k sx) (vshape X sX) (vshape x sx) (= m (sz Y do)) "
    "(= h1 (sz Y (+ do 1))) (= h2 (sz Y (+ do 2))) "
    "(= h (* h1 h2)) (= h2 (sz y (+ do 2))) (= 0 (% s h2)) (= 0 (% e h2)) (= n (- e s))) "
    "((sel Y y (+ do 1) (RCons (/ s h2) (/ e h2) (RNil)))))",
)

# ---------------------------------------------------------------------------------------------
# contractions over an index set, and how its contribution travels
# ---------------------------------------------------------------------------------------------
_rule(
    "row-parallel-linear-over-index-set",
    "partial",
    "x[..., R] @ W[:, R]^T is the contribution of the input features R to x @ W^T",
    "(rule ((= Y (Linear X W)) (= y (Linear x w)) (sel X x -1 R) (sel W w -1 R) " + _SEVERAL + " "
    "(= K (sz X -1))) ((psumi Y y R K)))",
)
_rule(
    "matmul-contraction-over-index-set",
    "partial",
    "A[..., R] @ B[R, :] is the contribution of the indices R to A @ B",
    "(rule ((= Y (Matmul A B)) (= y (Matmul a b)) (sel A a -1 R) (sel B b -2 R) " + _SEVERAL + " "
    "(= K (sz A -1))) ((psumi Y y R K)))",
)
_rule(
    "sum-of-index-set-is-partial",
    "partial",
    "summing the indices R of the reduced dim is their contribution to the sum",
    '(rule ((= Y (Red "sum" X d k)) (= y (Red "sum" x d k)) (sel X x d R) ' + _SEVERAL + " "
    "(= K (sz X d))) ((psumi Y y R K)))",
)
_rule(
    "index-set-partial-unary-linear",
    "partial",
    "negation and casts are linear",
    "(rule ((= Y (Un f X)) (= y (Un f x)) (psumi X x R K) (linear-unary f)) ((psumi Y y R K)))",
)
_rule(
    "index-set-partial-scaled",
    "partial",
    "scaling by a constant is linear",
    "(rule ((= Y (Sc f X c)) (= y (Sc f x c)) (psumi X x R K) (scaling f)) ((psumi Y y R K)))",
)
_rule(
    "index-set-partial-viewed",
    "partial",
    "a view of a contribution is the contribution to the view",
    "(rule ((= Y (View X s1)) (= y (View x s1)) (psumi X x R K)) ((psumi Y y R K)))",
)
_rule(
    "index-set-partial-permuted",
    "partial",
    "a permutation of a contribution is the contribution to the permutation",
    "(rule ((= Y (Permute X p)) (= y (Permute x p)) (psumi X x R K)) ((psumi Y y R K)))",
)

# ---------------------------------------------------------------------------------------------
# all-reduce: the ranks' index sets partition [0, K)
# ---------------------------------------------------------------------------------------------
_rule(
    "index-set-cover-start",
    "partial",
    "the contribution whose index set starts at 0 starts a cover",
    "(rule ((psumi Z p R K) (= R (RCons 0 e t)) (ascending R) (arin p)) ((coveri Z (multiset-of p) R K)))",
)
_rule(
    "index-set-cover-extend",
    "partial",
    "a cover of [0, g) and more is extended by the contribution whose index set starts at g: the sets merged "
    "(the merge never evaluates when they overlap)",
    "(rule ((coveri Z ms U K) (= U (RCons 0 g t)) (psumi Z p V K) (= V (RCons g h t2)) (ascending V) (arin p)) "
    "((coverip Z (multiset-insert ms p) (RUnion U V) K)))",
)
_rule(
    "index-set-cover-evaluated",
    "partial",
    "a cover whose merged index list evaluated is a cover",
    "(rule ((coverip Z ms U K) (evaluated U) (ascending U)) ((coveri Z ms U K)))",
)
_rule(
    "all-reduce-of-index-set-partition",
    "partial",
    "summing contributions whose index sets partition [0, K) gives the value",
    "(rule ((coveri Z ms U K) (= U (RCons 0 K (RNil))) (= S (SumN ms))) ((union Z S)))",
)
