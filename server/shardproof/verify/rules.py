"""The rule library, as data: every rule has a name, a family (its ruleset), its egglog text and
what it means. Families run in the order of `FAMILIES`; `ranges` and `shapes` run to saturation
before every pass of the others.

Soundness: each relation rule derives a fact that holds by the semantics of the ops it matches
(see language.py for what each relation means); each rewrite states an identity of tensor
algebra. Side conditions are exact integer conditions on shapes and ranges, never approximations.
"""

from __future__ import annotations

from dataclasses import dataclass

RULE_LIBRARY_VERSION = "15"


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    text: str  # an egglog `rule` or `rewrite` command without :ruleset / :name
    meaning: str

    def command(self) -> str:
        body = self.text.strip()
        assert body.endswith(")"), self.name
        return f'{body[:-1]} :ruleset {self.family} :name "{self.name}")'


# Rule families, one ruleset each: the range-list algebra and shape inference (run to saturation
# before every pass), then distribution over concatenation, slice algebra, layout (reshape,
# transpose, expand, repeat), column/row-parallel matmul, attention and softmax, normalisation and
# other reductions, elementwise ops, vocab-parallel embedding masking, partial-sum algebra, and
# vocab-parallel losses (partial maxes, the target's logit).
FAMILIES = (
    "ranges",
    "shapes",
    "concat",
    "slicing",
    "layout",
    "matmul",
    "attention",
    "normalization",
    "elementwise",
    "embedding",
    "partial",
    "loss",
    "derived",  # laws of opaque calls from DTensor's strategies (op_laws.py): rules in each unit
)
SATURATED_FAMILIES = ("ranges", "shapes")

_RULES: list[Rule] = []


def _rule(name: str, family: str, meaning: str, text: str) -> None:
    _RULES.append(Rule(name, family, text, meaning))


# ---------------------------------------------------------------------------------------------
# ranges: list algebra over selections
# ---------------------------------------------------------------------------------------------
_rule("range-append-nil", "ranges", "[] ++ r = r", "(rewrite (RApp (RNil) r) r)")
_rule(
    "range-append-cons",
    "ranges",
    "(s,e):t ++ r = (s,e):(t ++ r)",
    "(rewrite (RApp (RCons s e t) r) (RCons s e (RApp t r)))",
)
_rule("range-shift-nil", "ranges", "shift [] = []", "(rewrite (RShift (RNil) k) (RNil))")
_rule(
    "range-shift-cons",
    "ranges",
    "shift every range by k",
    "(rewrite (RShift (RCons s e t) k) (RCons (+ s k) (+ e k) (RShift t k)))",
)
_rule("range-clip-nil", "ranges", "clip [] = []", "(rewrite (RClip (RNil) a b) (RNil))")
_rule(
    "range-clip-cons",
    "ranges",
    "ranges inside [a, b) re-based to a",
    "(rewrite (RClip (RCons s e t) a b) (RCons (- s a) (- e a) (RClip t a b)) :when ((<= a s) (<= e b)))",
)
_rule("range-mul-nil", "ranges", "scale [] = []", "(rewrite (RMul (RNil) k) (RNil))")
_rule(
    "range-mul-cons",
    "ranges",
    "index ranges of an outer dim, seen in a merged dim",
    "(rewrite (RMul (RCons s e t) k) (RCons (* s k) (* e k) (RMul t k)))",
)
_rule("range-div-nil", "ranges", "divide [] = []", "(rewrite (RDiv (RNil) k) (RNil))")
_rule(
    "range-div-cons",
    "ranges",
    "ranges aligned to k, seen in the outer dim of a split",
    "(rewrite (RDiv (RCons s e t) k) (RCons (/ s k) (/ e k) (RDiv t k)) :when ((= 0 (% s k)) (= 0 (% e k))))",
)
_rule("range-sub-empty", "ranges", "positions [a, a) select nothing", "(rewrite (RSub r a a) (RNil))")
_rule(
    "range-sub-inside",
    "ranges",
    "positions [a, b) inside the first range",
    "(rewrite (RSub (RCons s e t) a b) (RCons (+ s a) (+ s b) (RNil)) :when ((< a b) (<= b (- e s))))",
)
_rule(
    "range-sub-skip",
    "ranges",
    "positions past the first range",
    "(rewrite (RSub (RCons s e t) a b) (RSub t (- a (- e s)) (- b (- e s))) :when ((< a b) (>= a (- e s))))",
)
_rule(
    "range-sub-straddle",
    "ranges",
    "positions [a, b) straddling the end of the first range",
    "(rewrite (RSub (RCons s e t) a b) (RCons (+ s a) e (RSub t 0 (- b (- e s)))) :when ((< a (- e s)) (> b (- e s))))",
)
_rule("range-compose-nil", "ranges", "select nothing of a selection", "(rewrite (RCompose r (RNil)) (RNil))")
_rule(
    "range-compose-cons",
    "ranges",
    "positions of a selection, as ranges of the original",
    "(rewrite (RCompose r (RCons a b t)) (RApp (RSub r a b) (RCompose r t)))",
)
_rule(
    "range-merge-adjacent",
    "ranges",
    "adjacent ranges select the same as their union",
    "(rule ((= r (RCons s e (RCons e f t)))) ((union r (RCons s f t)) (subsume (RCons s e (RCons e f t)))))",
)
_rule("range-evaluated-nil", "ranges", "the empty list is evaluated", "(rule ((= r (RNil))) ((evaluated r)))")
_rule(
    "range-evaluated-cons",
    "ranges",
    "a range followed by an evaluated list is evaluated",
    "(rule ((= r (RCons s e t)) (evaluated t)) ((evaluated r)))",
)
_rule(
    "pending-selection-evaluated",
    "ranges",
    "a selection whose range list evaluated is a fact; one whose list operation failed (unaligned, "
    "out of bounds) never becomes one",
    "(rule ((selp X x d R) (evaluated R)) ((sel X x d R)))",
)

# ---------------------------------------------------------------------------------------------
# shapes of terms created by rewrites (front-end terms carry their shapes already)
# ---------------------------------------------------------------------------------------------
_rule(
    "shape-slice-dim",
    "shapes",
    "a slice has e - s elements along its dim",
    "(rule ((= y (Slice x d s e)) (= n (nd x))) ((set (sz y d) (- e s)) (set (nd y) n)))",
)
_rule(
    "shape-slice-other",
    "shapes",
    "a slice keeps the other dims",
    "(rule ((= y (Slice x d s e)) (= n (sz x d2)) (!= d d2)) ((set (sz y d2) n)))",
)
_rule(
    "shape-cat-dim",
    "shapes",
    "a concatenation adds up its dim",
    "(rule ((= y (Cat a b d)) (= na (sz a d)) (= nb (sz b d)) (= n (nd a))) ((set (sz y d) (+ na nb)) (set (nd y) n)))",
)
_rule(
    "shape-cat-other",
    "shapes",
    "a concatenation keeps the other dims",
    "(rule ((= y (Cat a b d)) (= n (sz a d2)) (!= d d2)) ((set (sz y d2) n)))",
)
_rule(
    "shape-linear-out",
    "shapes",
    "linear: the last dim is the weight's row count",
    "(rule ((= y (Linear x w)) (= n (sz w -2)) (= k (nd x))) ((set (sz y -1) n) (set (nd y) k)))",
)
_rule(
    "shape-linear-batch",
    "shapes",
    "linear keeps the input's leading dims",
    "(rule ((= y (Linear x w)) (= n (sz x d)) (< d -1)) ((set (sz y d) n)))",
)

# ---------------------------------------------------------------------------------------------
# normalize: identities that expose pieces of fused values (they create terms, boundedly)
# ---------------------------------------------------------------------------------------------
_rule(
    "linear-of-row-concat",
    "concat",
    "x @ cat(A, B)^T = cat(x @ A^T, x @ B^T) along the last dim",
    "(rewrite (Linear x (Cat a b -2)) (Cat (Linear x a) (Linear x b) -1))",
)
_rule(
    "slice-of-concat-first",
    "concat",
    "cat(a, b)[0:len(a)] = a",
    "(rewrite (Slice (Cat a b d) d 0 n) a :when ((= n (sz a d))))",
)
_rule(
    "slice-of-concat-inside-first",
    "concat",
    "a slice inside the first piece is a slice of it",
    "(rewrite (Slice (Cat a b d) d s e) (Slice a d s e) :when ((= na (sz a d)) (<= e na) (< 0 s)))",
)
_rule(
    "slice-of-concat-inside-first-start",
    "concat",
    "a slice at the start of the first piece",
    "(rewrite (Slice (Cat a b d) d 0 e) (Slice a d 0 e) :when ((= na (sz a d)) (< e na)))",
)
_rule(
    "slice-of-concat-second",
    "concat",
    "a slice inside the second piece is a slice of it",
    "(rewrite (Slice (Cat a b d) d s e) (Slice b d (- s na) (- e na)) :when ((= na (sz a d)) (>= s na)))",
)
_rule(
    "slice-whole",
    "slicing",
    "the whole extent of a dim is the value itself",
    "(rule ((= y (Slice x d 0 n)) (= n (sz x d))) ((union y x)))",
)

_rule(
    "permutation-scatter-overwrites-base",
    "slicing",
    "base[perm] = v with perm the indices that sort a vector of base's length (a permutation) writes every "
    "element, so the result does not depend on base: the inverse permutation `inv = empty_like(perm); "
    "inv[perm] = arange(n)` of MoE token sorting is the same value whatever memory `empty_like` returned",
    '(rule ((= Y (Op3 "aten::index_put#0" B I V "[\\"<tensor>\\", [\\"<tensor>\\"], \\"<tensor>\\"]")) '
    '(= I (Along "sort#1" X -1 a)) (= 1 (nd X)) (= 1 (nd B)) (= 1 (nd V)) (= n (sz X -1)) (= n (sz B -1)) '
    "(= n (sz V -1))) "
    '((union Y (Op3 "aten::index_put#0" V I V "[\\"<tensor>\\", [\\"<tensor>\\"], \\"<tensor>\\"]"))))',
)

# ---------------------------------------------------------------------------------------------
# movement: how selections pass through data-movement ops
# ---------------------------------------------------------------------------------------------
_rule(
    "slice-is-selection",
    "slicing",
    "x[d, s:e] selects range [s, e) of x",
    "(rule ((= x (Slice X d s e))) ((sel X x d (RCons s e (RNil)))))",
)
_rule(
    "full-selection-is-equal",
    "slicing",
    "selecting all of a dim in order is the value",
    "(rule ((sel X x d (RCons 0 n (RNil))) (= n (sz X d))) ((union X x)))",
)
_rule(
    "slice-of-selection",
    "slicing",
    "slicing a selection selects the corresponding original ranges",
    "(rule ((sel X x d R) (= y (Slice x d a b))) ((selp X y d (RSub R a b))))",
)
_rule(
    "selection-within-slice",
    "slicing",
    "a selection inside the reference's own slice is a selection of it",
    "(rule ((sel X x d R) (= Y (Slice X d a b))) ((selp Y x d (RClip R a b))))",
)
_rule(
    "slice-other-dim",
    "slicing",
    "slicing another dim the same way keeps the selection",
    "(rule ((sel X x d R) (= Y (Slice X d2 a b)) (= y (Slice x d2 a b)) (!= d d2)) ((sel Y y d R)))",
)
_rule(
    "slice-other-dim-of-reference",
    "slicing",
    "slicing another dim of a selection selects the same ranges of the reference's slice (which "
    "the reference need not compute: an all-to-all sends blocks of another dim)",
    "(rule ((sel X x d R) (= y (Slice x d2 a b)) (!= d d2) (a2a-piece y)) ((sel (Slice X d2 a b) y d R)))",
)
_rule(
    "moved-piece-through-view",
    "slicing",
    "a block an exchange moves, flattened for the exchange (`all_to_all` with lists of tensors sends each "
    "piece as a flat row of one buffer), is moved as the piece before the view: the guard of "
    "slice-other-dim-of-reference follows it (no claim on values)",
    "(rule ((a2a-piece v) (= v (View y s))) ((a2a-piece y)))",
)
_rule(
    "concat-of-selections",
    "concat",
    "concatenating selections of one value concatenates their ranges",
    "(rule ((= c (Cat a b d)) (sel X a d Ra) (sel X b d Rb)) ((selp X c d (RApp Ra Rb))))",
)
_rule(
    "concat-piecewise",
    "concat",
    "concatenating selections of the reference's pieces along the same dim",
    "(rule ((= C (Cat A B d)) (= c (Cat a b d)) (sel A a d Ra) (sel B b d Rb) (= na (sz A d))) "
    "((selp C c d (RApp Ra (RShift Rb na)))))",
)
_rule(
    "concat-piecewise-left-equal",
    "concat",
    "as concat-piecewise, first piece replicated",
    "(rule ((= C (Cat A B d)) (= c (Cat A b d)) (sel B b d Rb) (= na (sz A d))) "
    "((selp C c d (RCons 0 na (RShift Rb na)))))",
)
_rule(
    "concat-piecewise-right-equal",
    "concat",
    "as concat-piecewise, second piece replicated",
    "(rule ((= C (Cat A B d)) (= c (Cat a B d)) (sel A a d Ra) (= na (sz A d)) (= nb (sz B d))) "
    "((selp C c d (RApp Ra (RCons na (+ na nb) (RNil))))))",
)
_rule(
    "concat-other-dim",
    "concat",
    "concatenating along another dim keeps a common selection",
    "(rule ((= C (Cat A B d2)) (= c (Cat a b d2)) (sel A a d R) (sel B b d R) (!= d d2)) ((sel C c d R)))",
)
_rule(
    "view-keep",
    "layout",
    "a view that keeps a dim keeps its selection",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di R) (vkeep Y di do k) (vkeep y di do k)) ((sel Y y do R)))",
)
_rule(
    "view-split",
    "layout",
    "splitting a dim (heads x head_dim): selections aligned to the inner size",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di R) (vsplit Y di do h k) (vsplit y di do h k)) "
    "((selp Y y do (RDiv R h))))",
)
_rule(
    "view-merge",
    "layout",
    "merging an outer dim into the next: selections scale by the inner size",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di R) (vmerge Y di do h k) (vmerge y di do h k)) "
    "((selp Y y do (RMul R h))))",
)
_rule(
    "permute-moves-selection",
    "layout",
    "a permutation moves the selected dim",
    "(rule ((= Y (Permute X p)) (= y (Permute x p)) (sel X x di R) (pmap Y di do)) ((sel Y y do R)))",
)
_rule(
    "expand-keeps-selection",
    "layout",
    "broadcasting other dims alike keeps a selection",
    "(rule ((= Y (Expand X s1)) (= y (Expand x s2)) (sel X x d R) (emap Y d k1) (emap y d k2) (= k1 k2)) "
    "((sel Y y d R)))",
)
_rule(
    "expand-broadcast-window",
    "layout",
    "expanding one value to a shape shorter along a broadcast dim gives any window of its expansion to "
    "the longer shape (every position along a broadcast dim holds the same values)",
    "(rule ((= Y (Expand X s1)) (= y (Expand X s2)) (ebk Y d key) (ebk y d key) (= n (sz y d)) (= K (sz Y d)) "
    "(< n K)) ((selw Y y d 0 (- K n) n)))",
)
_rule(
    "repeat-scales-selection",
    "layout",
    "repeating every slice m times scales the selected ranges",
    "(rule ((= Y (Rep X d m)) (= y (Rep x d m)) (sel X x d R)) ((selp Y y d (RMul R m))))",
)
_rule(
    "repeat-other-dim",
    "layout",
    "repeating along another dim keeps a selection",
    "(rule ((= Y (Rep X d m)) (= y (Rep x d m)) (sel X x d2 R) (!= d d2)) ((sel Y y d2 R)))",
)
_rule(
    "repeat-fewer-copies",
    "layout",
    "m2 < m copies of one slice equal any m2 consecutive copies of it among the reference's m",
    "(rule ((= Y (Rep X d m)) (= y (Rep x d m2)) (sel X x d (RCons s (+ s 1) (RNil))) (< m2 m)) "
    "((selw Y y d (* s m) (- (+ (* s m) m) m2) m2)))",
)
_rule(
    "window-slice",
    "slicing",
    "a window selection sliced along another dim",
    "(rule ((selw X x d lo hi n) (= Y (Slice X d2 a b)) (= y (Slice x d2 a b)) (!= d d2)) ((selw Y y d lo hi n)))",
)
_rule(
    "window-permute",
    "layout",
    "a permutation moves a window selection",
    "(rule ((= Y (Permute X p)) (= y (Permute x p)) (selw X x di lo hi n) (pmap Y di do)) ((selw Y y do lo hi n)))",
)

# ---------------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------------
_rule(
    "unary-keeps-selection",
    "elementwise",
    "f(X)[R] = f(X[R]) for elementwise f",
    "(rule ((= Y (Un f X)) (= y (Un f x)) (sel X x d R)) ((sel Y y d R)))",
)
_rule(
    "scalar-keeps-selection",
    "elementwise",
    "f(X, c)[R] = f(X[R], c)",
    "(rule ((= Y (Sc f X c)) (= y (Sc f x c)) (sel X x d R)) ((sel Y y d R)))",
)
_rule(
    "int-scalar-keeps-selection",
    "elementwise",
    "f(X, c)[R] = f(X[R], c)",
    "(rule ((= Y (ScI f X c)) (= y (ScI f x c)) (sel X x d R)) ((sel Y y d R)))",
)
_rule(
    "unary-keeps-window",
    "elementwise",
    "elementwise ops keep window selections",
    "(rule ((= Y (Un f X)) (= y (Un f x)) (selw X x d lo hi n)) ((selw Y y d lo hi n)))",
)
_rule(
    "binary-both-selected",
    "elementwise",
    "f(A, B)[R] = f(A[R], B[R])",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (sel A a d R) (sel B b d R)) ((sel Y y d R)))",
)
_rule(
    "regroup-selected-sum-right",
    "elementwise",
    "(a + c) + b = a + (c + b): a rank adding two selections and then a replicated term, where the reference "
    "groups the last two (a residual, then a bias added after the reduce-scatter)",
    '(rule ((= y (Bin "add" ac b)) (= ac (Bin "add" a c)) (sel X a d R) (sel C c d R) (= Y (Bin "add" X Cb)) '
    '(= Cb (Bin "add" C b))) ((union y (Bin "add" a (Bin "add" c b)))))',
)
_rule(
    "regroup-selected-sum-left",
    "elementwise",
    "a + (c + b) = (a + c) + b: as regroup-selected-sum-right, the groupings exchanged",
    '(rule ((= y (Bin "add" a cb)) (= cb (Bin "add" c b)) (sel X a d R) (sel C c d R) (= Y (Bin "add" XC b)) '
    '(= XC (Bin "add" X C))) ((union y (Bin "add" (Bin "add" a c) b))))',
)
_rule(
    "binary-left-selected-right-broadcast",
    "elementwise",
    "f(A, B)[R] = f(A[R], B) when B is broadcast along the dim",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a B)) (sel A a d R) (= 1 (sz B d))) ((sel Y y d R)))",
)
_rule(
    "binary-left-selected-right-lower-rank",
    "elementwise",
    "f(A, B)[R] = f(A[R], B) when B has no such dim",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a B)) (sel A a d R) (= k (nd B)) (< k (- 0 d))) ((sel Y y d R)))",
)
_rule(
    "binary-right-selected-left-broadcast",
    "elementwise",
    "f(A, B)[R] = f(A, B[R]) when A is broadcast along the dim",
    "(rule ((= Y (Bin f A B)) (= y (Bin f A b)) (sel B b d R) (= 1 (sz A d))) ((sel Y y d R)))",
)
_rule(
    "binary-right-selected-left-lower-rank",
    "elementwise",
    "f(A, B)[R] = f(A, B[R]) when A has no such dim",
    "(rule ((= Y (Bin f A B)) (= y (Bin f A b)) (sel B b d R) (= k (nd A)) (< k (- 0 d))) ((sel Y y d R)))",
)
_rule(
    "window-meets-selection-left",
    "elementwise",
    "a window operand combined with a selected one is that selection (any window position is)",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (selw A a d lo hi n) (sel B b d (RCons s e (RNil))) "
    "(= n (- e s)) (<= lo s) (<= s hi)) ((sel A a d (RCons s e (RNil)))))",
)
_rule(
    "window-meets-selection-right",
    "elementwise",
    "as window-meets-selection-left, operands swapped",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (selw B b d lo hi n) (sel A a d (RCons s e (RNil))) "
    "(= n (- e s)) (<= lo s) (<= s hi)) ((sel B b d (RCons s e (RNil)))))",
)
_rule(
    "window-meets-selection-in-concat-left",
    "concat",
    "a window piece concatenated with a selected piece is that selection (any window position is): a key "
    "shared by every head, expanded to a rank's heads, next to the rank's block of per-head keys",
    "(rule ((= C (Cat A B d2)) (= c (Cat a b d2)) (selw A a d lo hi n) (sel B b d (RCons s e (RNil))) "
    "(= n (- e s)) (<= lo s) (<= s hi)) ((sel A a d (RCons s e (RNil)))))",
)
_rule(
    "window-meets-selection-in-concat-right",
    "concat",
    "as window-meets-selection-in-concat-left, pieces swapped",
    "(rule ((= C (Cat A B d2)) (= c (Cat a b d2)) (selw B b d lo hi n) (sel A a d (RCons s e (RNil))) "
    "(= n (- e s)) (<= lo s) (<= s hi)) ((sel B b d (RCons s e (RNil)))))",
)
_rule(
    "fill-selected-mask-broadcast",
    "elementwise",
    "masked_fill(X, M, v)[R] = masked_fill(X[R], M, v)",
    "(rule ((= Y (Fill X M v)) (= y (Fill x M v)) (sel X x d R) (= 1 (sz M d))) ((sel Y y d R)))",
)
_rule(
    "fill-selected-mask-lower-rank",
    "elementwise",
    "masked_fill(X, M, v)[R] = masked_fill(X[R], M, v) when M has no such dim (a causal mask over heads)",
    "(rule ((= Y (Fill X M v)) (= y (Fill x M v)) (sel X x d R) (= k (nd M)) (< k (- 0 d))) ((sel Y y d R)))",
)
_rule(
    "fill-both-selected",
    "elementwise",
    "masked_fill(X, M, v)[R] = masked_fill(X[R], M[R], v)",
    "(rule ((= Y (Fill X M v)) (= y (Fill x m v)) (sel X x d R) (sel M m d R)) ((sel Y y d R)))",
)
_rule(
    "where-all-selected",
    "elementwise",
    "where(C, A, B)[R] = where(C[R], A[R], B[R])",
    "(rule ((= Y (Where C A B)) (= y (Where c a b)) (sel C c d R) (sel A a d R) (sel B b d R)) ((sel Y y d R)))",
)

# ---------------------------------------------------------------------------------------------
# reductions and normalisations
# ---------------------------------------------------------------------------------------------
_rule(
    "reduce-other-dim-keepdim",
    "normalization",
    "reducing another dim (keepdim) keeps a selection",
    "(rule ((= Y (Red f X d 1)) (= y (Red f x d 1)) (sel X x d2 R) (!= d d2)) ((sel Y y d2 R)))",
)
_rule(
    "reduce-inner-dim",
    "normalization",
    "reducing a dim to the right of the selection shifts it",
    "(rule ((= Y (Red f X d 0)) (= y (Red f x d 0)) (sel X x d2 R) (< d2 d)) ((sel Y y (+ d2 1) R)))",
)
_rule(
    "reduce-outer-dim",
    "normalization",
    "reducing a dim to the left of the selection keeps it",
    "(rule ((= Y (Red f X d 0)) (= y (Red f x d 0)) (sel X x d2 R) (> d2 d)) ((sel Y y d2 R)))",
)
_rule(
    "sum-of-selection-is-partial",
    "normalization",
    "summing one range of the reduced dim is a partial sum",
    '(rule ((= Y (Red "sum" X d k)) (= y (Red "sum" x d k)) (sel X x d (RCons s e (RNil))) (= K (sz X d))) '
    "((psum Y y s e K)))",
)
_rule(
    "sum-over-concatenated-dim",
    "normalization",
    "summing over the dim of a concatenation adds the sums of its pieces (a stack of all-gathered partial "
    "sums added up locally is an all-reduce)",
    '(rewrite (Red "sum" (Cat a b d) d k) (Bin "add" (Red "sum" a d k) (Red "sum" b d k)))',
)
_rule(
    "max-over-concatenated-dim",
    "normalization",
    "the max over the dim of a concatenation is the larger of its pieces' maxima",
    '(rewrite (Red "amax" (Cat a b d) d k) (Bin "maximum" (Red "amax" a d k) (Red "amax" b d k)))',
)
_rule(
    "min-over-concatenated-dim",
    "normalization",
    "the min over the dim of a concatenation is the smaller of its pieces' minima",
    '(rewrite (Red "amin" (Cat a b d) d k) (Bin "minimum" (Red "amin" a d k) (Red "amin" b d k)))',
)
_rule(
    "reduce-inserted-unit-dim",
    "normalization",
    "reducing (sum, mean, max, min, prod, logsumexp) over a size-1 dim a view only inserted gives back the "
    "view's source: each reduction of one element is that element",
    "(rule ((= Y (Red f X d 0)) (= X (View x s)) (vunit X d) (unit-reduction f)) ((union Y x)))",
)
_rule(
    "reduce-unit-dim-keepdim",
    "normalization",
    "reducing over a size-1 dim, keeping it, changes nothing",
    "(rule ((= Y (Red f X d 1)) (= 1 (sz X d)) (unit-reduction f)) ((union Y X)))",
)
_rule(
    "view-back-to-source",
    "layout",
    "viewing a view of x back to x's own shape gives x (a partial sum viewed flat for its all-reduce, then "
    "viewed back)",
    "(rule ((= y (View X s2)) (= X (View x s1)) (vshape x s2)) ((union y x)))",
)
_rule(
    "squeeze-undoes-unsqueeze",
    "layout",
    "removing the size-1 dim a view inserted gives back the view's source",
    "(rule ((= y (View X sh)) (= X (View x sh0)) (vunit X d) (vsqueeze y d)) ((union y x)))",
)
_rule(
    "softmax-other-dim",
    "attention",
    "softmax over another dim keeps a selection",
    "(rule ((= Y (Softmax X d)) (= y (Softmax x d)) (sel X x d2 R) (!= d d2)) ((sel Y y d2 R)))",
)
_rule(
    "along-other-dim",
    "attention",
    "an op on each fiber along d (topk, cumsum) keeps a selection of another dim",
    "(rule ((= Y (Along f X d a)) (= y (Along f x d a)) (sel X x d2 R) (!= d d2)) ((sel Y y d2 R)))",
)
_rule(
    "log-softmax-other-dim",
    "attention",
    "log_softmax over another dim keeps a selection",
    "(rule ((= Y (LogSoftmax X d)) (= y (LogSoftmax x d)) (sel X x d2 R) (!= d d2)) ((sel Y y d2 R)))",
)

# ---------------------------------------------------------------------------------------------
# contractions: linear, matmul, attention
# ---------------------------------------------------------------------------------------------
_rule(
    "column-parallel-linear",
    "matmul",
    "x @ W[R]^T = (x @ W^T)[..., R]",
    "(rule ((= Y (Linear X W)) (= y (Linear X w)) (sel W w -2 R)) ((sel Y y -1 R)))",
)
_rule(
    "row-parallel-linear",
    "matmul",
    "x[..., s:e] @ W[:, s:e]^T is the contribution of input features [s, e) to x @ W^T",
    "(rule ((= Y (Linear X W)) (= y (Linear x w)) (sel X x -1 (RCons s e (RNil))) (sel W w -1 (RCons s e (RNil))) "
    "(= K (sz X -1))) ((psum Y y s e K)))",
)
_rule(
    "linear-leading-dim",
    "matmul",
    "rows of x map to rows of x @ W^T",
    "(rule ((= Y (Linear X W)) (= y (Linear x W)) (sel X x d R) (< d -1)) ((sel Y y d R)))",
)
_rule(
    "matmul-by-transpose-is-linear",
    "matmul",
    "x @ W.T is the linear map x @ W^T for a matrix W (DeepSpeed's `matmul(x, W.transpose(-1, -2))`, `x @ W.t()`; "
    'the permutation "1,0" exists only for matrices)',
    '(rule ((= y (Matmul x p)) (= p (Permute W "1,0"))) ((union y (Linear x W))))',
)
_rule(
    "matmul-batch",
    "matmul",
    "batched matmul keeps a common batch selection",
    "(rule ((= Y (Matmul A B)) (= y (Matmul a b)) (sel A a d R) (sel B b d R) (< d -2)) ((sel Y y d R)))",
)
_rule(
    "matmul-rows",
    "matmul",
    "rows of A map to rows of A @ B",
    "(rule ((= Y (Matmul A B)) (= y (Matmul a B)) (sel A a -2 R)) ((sel Y y -2 R)))",
)
_rule(
    "matmul-columns",
    "matmul",
    "columns of B map to columns of A @ B",
    "(rule ((= Y (Matmul A B)) (= y (Matmul A b)) (sel B b -1 R)) ((sel Y y -1 R)))",
)
_rule(
    "matmul-contraction",
    "matmul",
    "A[..., s:e] @ B[s:e, :] is a partial sum of A @ B",
    "(rule ((= Y (Matmul A B)) (= y (Matmul a b)) (sel A a -1 (RCons s e (RNil))) (sel B b -2 (RCons s e (RNil))) "
    "(= K (sz A -1))) ((psum Y y s e K)))",
)
_rule(
    "attention-heads",
    "attention",
    "attention is independent per head and per batch row",
    "(rule ((= Z (Sdpa Q K V at)) (= z (Sdpa q k v at)) (sel Q q d R) (sel K k d R) (sel V v d R) (< d -2)) "
    "((sel Z z d R)))",
)
_rule(
    "masked-attention-heads",
    "attention",
    "attention with one additive mask shared by every head (and batch row) is independent per head: the "
    "mask broadcasts over the selected dim, as the rank's output keeps the query's size there",
    "(rule ((= Z (SdpaMask Q K V M at)) (= z (SdpaMask q k v M at)) (sel Q q d R) (sel K k d R) (sel V v d R) "
    "(< d -2) (= n (sz q d)) (= n (sz z d))) ((sel Z z d R)))",
)
_rule(
    "attention-key-window",
    "attention",
    "a replicated key head serving the query heads [s, e) is the selection [s, e) of the repeated keys",
    "(rule ((= Z (Sdpa Q K V at)) (= z (Sdpa q k v at)) (sel Q q d (RCons s e (RNil))) (selw K k d lo hi n) "
    "(= n (- e s)) (<= lo s) (<= s hi)) ((sel K k d (RCons s e (RNil)))))",
)
_rule(
    "attention-value-window",
    "attention",
    "a replicated value head serving the query heads [s, e) is the selection [s, e) of the repeated values",
    "(rule ((= Z (Sdpa Q K V at)) (= z (Sdpa q k v at)) (sel Q q d (RCons s e (RNil))) (selw V v d lo hi n) "
    "(= n (- e s)) (<= lo s) (<= s hi)) ((sel V v d (RCons s e (RNil)))))",
)

# ---------------------------------------------------------------------------------------------
# embedding: vocab-parallel lookups
# ---------------------------------------------------------------------------------------------
_rule(
    "embedding-columns",
    "embedding",
    "embedding(ids, W[:, R]) = embedding(ids, W)[..., R]",
    "(rule ((= Y (Emb W I)) (= y (Emb w I)) (sel W w -1 R)) ((sel Y y -1 R)))",
)
_rule(
    "embedding-rows-of-ids",
    "embedding",
    "rows of the ids map to rows of the lookup",
    "(rule ((= Y (Emb W I)) (= y (Emb W i)) (sel I i d R)) ((sel Y y (- d 1) R)))",
)
_rule(
    "embedding-backward-of-token-rows",
    "embedding",
    "the embedding gradient of a block of token rows (their output gradients and ids) is that block's "
    "contribution to the embedding gradient of all tokens",
    '(rule ((= Y (Op2 "aten::embedding_dense_backward#0" G I p)) (= y (Op2 "aten::embedding_dense_backward#0" g i p)) '
    "(sel G g d (RCons s e (RNil))) (sel I i d2 (RCons s e (RNil))) (= d (- d2 1)) (= K (sz I d2))) "
    "((psum Y y s e K)))",
)
_rule(
    "vocab-mask",
    "embedding",
    "(ids < s) | (ids >= e) marks ids outside [s, e)",
    '(rule ((= m (Bin "or" (ScI "lt" I s) (ScI "ge" I e)))) ((outside m I s e)))',
)
_rule(
    "vocab-mask-swapped",
    "embedding",
    "(ids >= e) | (ids < s) marks ids outside [s, e)",
    '(rule ((= m (Bin "or" (ScI "ge" I e) (ScI "lt" I s)))) ((outside m I s e)))',
)
_rule(
    "vocab-local-ids",
    "embedding",
    "ids - s with the outside ids zeroed index the local shard",
    '(rule ((= l (Fill (ScI "sub" I s) m "0.0")) (outside m I s e)) ((localids l I s e)))',
)
_rule(
    "vocab-local-lookup",
    "embedding",
    "looking the local ids up in rows [s, e) of W",
    "(rule ((= y0 (Emb w l)) (localids l I s e) (sel W w -2 (RCons s e (RNil))) (= Y (Emb W I)) (outside m I s e)) "
    "((embpart y0 Y m s e)))",
)
_rule(
    "vocab-masked-lookup-is-partial",
    "embedding",
    "zeroing the outside rows leaves the contribution of vocabulary [s, e) to the lookup",
    '(rule ((embpart y0 Y m s e) (= y (Fill y0 u "0.0")) (= u (View m sh)) (= k (nd m)) (= (+ k 1) (nd u)) '
    "(= 1 (sz u -1)) (= Y (Emb W I)) (= V (sz W -2))) ((psum Y y s e V)))",
)

_rule(
    "vocab-inside-mask",
    "embedding",
    "(ids >= s) & (ids < e) marks the ids inside [s, e) (vLLM's vocabulary mask)",
    '(rule ((= m (Bin "and" (ScI "ge" I s) (ScI "lt" I e)))) ((inside m I s e)))',
)
_rule(
    "vocab-inside-mask-swapped",
    "embedding",
    "(ids < e) & (ids >= s) marks the ids inside [s, e)",
    '(rule ((= m (Bin "and" (ScI "lt" I e) (ScI "ge" I s)))) ((inside m I s e)))',
)
_rule(
    "not-inside-is-outside",
    "embedding",
    "the negation of the inside mask marks the ids outside [s, e)",
    "(rule ((inside m I s e) (= n (Un f m)) (negation f)) ((outside n I s e)))",
)
_rule(
    "negation-of-viewed-mask",
    "embedding",
    "an elementwise op on a view of a mask (its negation) is the view of the op on the mask",
    "(rule ((= n (Un f u)) (= u (View m sh)) (inside m I s e) (= k (nd m))) "
    "((union n (View (Un f m) sh)) (set (nd (Un f m)) k)))",
)
_rule(
    "arithmetic-local-ids",
    "embedding",
    "mask * (ids - s * mask) with the inside mask of [s, e) is ids - s inside and 0 outside: the local ids "
    "(vLLM's get_masked_input_and_mask)",
    '(rule ((inside m I s e) (= l (Bin "mul" m (Bin "sub" I (ScI "mul" m s))))) ((localids l I s e)))',
)
_rule(
    "local-lookup-reads-its-rows",
    "embedding",
    "local ids of [s, e) are in [0, e - s): a lookup in a longer table (a vocabulary shard padded to a "
    "multiple of the world size, as vLLM pads it) reads only its first e - s rows",
    "(rule ((localids l I s e) (= y (Emb W l)) (= n (- e s)) (= k (sz W -2)) (< n k) (< 0 n)) "
    "((union y (Emb (Slice W -2 0 n) l))))",
)
_rule(
    "vocab-whole-range-lookup",
    "embedding",
    "local ids of the whole vocabulary [0, V) are the ids themselves (token ids index the vocabulary)",
    "(rule ((localids l I 0 e) (= y (Emb W l)) (= e (sz W -2))) ((union y (Emb W I))))",
)
_rule(
    "vocab-whole-range-mask",
    "embedding",
    "no id lies outside the whole vocabulary [0, V): zeroing the rows of outside ids changes nothing",
    '(rule ((outside m I 0 e) (= Y (Emb W I)) (= e (sz W -2)) (= y (Fill Y u "0.0")) (= u (View m sh))) ((union y Y)))',
)

# ---------------------------------------------------------------------------------------------
# partial sums, shares and reductions over ranks
# ---------------------------------------------------------------------------------------------
_rule(
    "partial-whole-range",
    "partial",
    "the contribution of all reduced indices is the value",
    "(rule ((psum X x 0 K K)) ((union X x)))",
)
_rule("share-whole", "partial", "X * p / p is X", "(rule ((frac X x p p)) ((union X x)))")
_rule("division-is-share", "partial", "X / n is a 1/n share of X", '(rule ((= x (ScI "div" X n))) ((frac X x 1 n)))')
_rule(
    "share-of-share",
    "partial",
    "(X * p / q) / n is a p / (q n) share",
    '(rule ((frac X x p q) (= y (ScI "div" x n))) ((frac X y p (* q n))))',
)
_rule(
    "partial-unary-linear",
    "partial",
    "negation and casts are linear",
    "(rule ((= Y (Un f X)) (= y (Un f x)) (psum X x s e K) (linear-unary f)) ((psum Y y s e K)))",
)
_rule(
    "partial-scaled",
    "partial",
    "scaling by a constant is linear",
    "(rule ((= Y (Sc f X c)) (= y (Sc f x c)) (psum X x s e K) (scaling f)) ((psum Y y s e K)))",
)
_rule(
    "partial-int-scaled",
    "partial",
    "scaling by a constant is linear",
    "(rule ((= Y (ScI f X c)) (= y (ScI f x c)) (psum X x s e K) (scaling f)) ((psum Y y s e K)))",
)
_rule(
    "partial-sum-of-partials",
    "partial",
    "adding contributions of the same fraction of two reductions gives that fraction of the sum",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (additive f) (psum A a s e K) (psum B b s2 e2 K2) "
    "(= (* s K2) (* s2 K)) (= (* e K2) (* e2 K))) ((psum Y y s e K)))",
)
_rule(
    "regroup-partials-out-of-residual",
    "partial",
    "(X + A) + L = X + (A + L), where a rank adds its partial sums of A and L before one all-reduce (SGLang's "
    "parallel attention and MLP, reduce_results=False)",
    '(rule ((= y (Bin "add" a l)) (psum A a s e K) (psum L l s2 e2 K2) (= Y (Bin "add" XA L)) '
    '(= XA (Bin "add" X A))) ((union Y (Bin "add" X (Bin "add" A L)))))',
)
_rule(
    "regroup-partials-out-of-residual-with-term",
    "partial",
    "(X + A) + (L + b) = (X + (A + L)) + b: as regroup-partials-out-of-residual, with a bias added after the "
    "all-reduce",
    '(rule ((= y (Bin "add" a l)) (psum A a s e K) (psum L l s2 e2 K2) (= Y (Bin "add" XA M)) '
    '(= XA (Bin "add" X A)) (= M (Bin "add" L b))) ((union Y (Bin "add" (Bin "add" X (Bin "add" A L)) b))))',
)
_rule(
    "partial-adjacent",
    "partial",
    "the contributions of adjacent index ranges add up to the contribution of their union "
    "(gradients accumulated over consecutive micro-batches)",
    '(rule ((= y (Bin "add" a b)) (psum X a s e K) (psum X b e f K)) ((psum X y s f K)))',
)
_rule(
    "partial-adjacent-swapped",
    "partial",
    "as partial-adjacent, the later range first",
    '(rule ((= y (Bin "add" a b)) (psum X a e f K) (psum X b s e K)) ((psum X y s f K)))',
)
_rule(
    "partial-plus-share",
    "partial",
    "adding a 1/n share of B to a 1/n fraction of A's contributions is that fraction of A + B",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (additive f) (psum A a s e K) (frac B b p q) "
    "(= (* (- e s) q) (* K p))) ((psum Y y s e K)))",
)
_rule(
    "share-plus-partial",
    "partial",
    "as partial-plus-share, operands swapped",
    "(rule ((= Y (Bin f B A)) (= y (Bin f b a)) (additive f) (psum A a s e K) (frac B b p q) "
    "(= (* (- e s) q) (* K p))) ((psum Y y s e K)))",
)
_rule(
    "partial-times-replicated",
    "partial",
    "multiplying contributions by a common value is linear",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a B)) (psum A a s e K) (multiplicative f)) ((psum Y y s e K)))",
)
_rule(
    "partial-matmul-replicated",
    "partial",
    "a matrix product is linear in its left operand",
    "(rule ((= Y (Matmul A B)) (= y (Matmul a B)) (psum A a s e K)) ((psum Y y s e K)))",
)
_rule(
    "replicated-matmul-partial",
    "partial",
    "a matrix product is linear in its right operand",
    "(rule ((= Y (Matmul B A)) (= y (Matmul B a)) (psum A a s e K)) ((psum Y y s e K)))",
)
_rule(
    "partial-linear-replicated",
    "partial",
    "a linear map is linear in its input",
    "(rule ((= Y (Linear A W)) (= y (Linear a W)) (psum A a s e K)) ((psum Y y s e K)))",
)
_rule(
    "replicated-times-partial",
    "partial",
    "multiplying contributions by a common value is linear",
    '(rule ((= Y (Bin "mul" B A)) (= y (Bin "mul" B a)) (psum A a s e K)) ((psum Y y s e K)))',
)
_rule(
    "partial-reduced-again",
    "partial",
    "summing or averaging contributions over another dim is linear",
    "(rule ((= Y (Red f X d k)) (= y (Red f x d k)) (psum X x s e K) (additive-reduction f)) ((psum Y y s e K)))",
)
_rule(
    "partial-sliced",
    "partial",
    "slicing contributions is linear (the reference's slice is made if it does not exist: a rank may "
    "split its partial sums before a reduce-scatter)",
    "(rule ((= y (Slice x d a b)) (psum X x s e K)) ((psum (Slice X d a b) y s e K)))",
)
_rule(
    "partial-concatenated",
    "partial",
    "concatenating the contributions of the same indices of two values is that contribution of their "
    "concatenation (a rank stacking its partial sums by destination before a reduce-scatter)",
    "(rule ((= y (Cat a b d)) (psum A a s e K) (psum B b s e K)) ((psum (Cat A B d) y s e K)))",
)
_rule(
    "partial-viewed",
    "partial",
    "reshaping contributions is linear",
    "(rule ((= Y (View X s1)) (= y (View x s1)) (psum X x s e K)) ((psum Y y s e K)))",
)
_rule(
    "partial-permuted",
    "partial",
    "permuting contributions is linear",
    "(rule ((= Y (Permute X p)) (= y (Permute x p)) (psum X x s e K)) ((psum Y y s e K)))",
)
_rule(
    "share-scaled",
    "partial",
    "a share of X times a common value is that share of the product",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a B)) (frac A a p q) (multiplicative f)) ((frac Y y p q)))",
)
_rule(
    "reduction-cover-start",
    "partial",
    "collect contributions tiling [0, e) that feed an all-reduce",
    "(rule ((psum Z p 0 e K) (arin p)) ((cover Z (multiset-of p) e K)))",
)
_rule(
    "reduction-cover-extend",
    "partial",
    "extend a tiling by the next contiguous contribution",
    "(rule ((cover Z ms e K) (psum Z p e f K) (arin p)) ((cover Z (multiset-insert ms p) f K)))",
)
_rule(
    "all-reduce-of-tiling",
    "partial",
    "summing contributions that tile [0, K) gives the value",
    "(rule ((cover Z ms K K) (= S (SumN ms))) ((union Z S)))",
)

# A rank may add a term to its partial sum that the reference adds to the whole value once (vLLM's
# row-parallel bias on rank 0 only, a residual folded into one rank's partial sum): the ranks'
# contributions still add up to the reference value when they tile the reduction and exactly one
# of them carries the term. The reference's `A + b` and the rank's `a + b` share b's e-class (b is
# the same value on the rank), so each orientation of the two adds is one rule.
for _name, _rank_add, _reference_add in (
    ("partial-plus-term", '(Bin "add" a b)', '(Bin "add" A b)'),
    ("term-plus-partial", '(Bin "add" b a)', '(Bin "add" A b)'),
    ("partial-plus-term-swapped", '(Bin "add" a b)', '(Bin "add" b A)'),
    ("term-plus-partial-swapped", '(Bin "add" b a)', '(Bin "add" b A)'),
):
    _rule(
        _name,
        "partial",
        "a rank's contribution to A plus a term b is that contribution of A + b, with the term once",
        f"(rule ((= y {_rank_add}) (psum A a s e K) (= Y {_reference_add})) ((pplus Y A y s e K)))",
    )
# The reference may add the term to a sum that already holds another: `x + (A + bias)` where the
# rank folds x into its partial sum of A and adds the bias after the all-reduce (a residual on
# one rank before a row-parallel layer's bias). Associativity and commutativity give `(A + x) +
# bias`, whose inner sum the rules above relate; the regrouping is stated only where a rank holds
# a partial sum of A, so it creates a term only where one can be used.
_rule(
    "regroup-term-into-right-sum",
    "partial",
    "x + (A + c) = (A + x) + c, where a rank holds a partial sum of A",
    '(rule ((= Y (Bin "add" X (Bin "add" A C))) (psum A a s e K)) ((union Y (Bin "add" (Bin "add" A X) C))))',
)
_rule(
    "regroup-term-into-left-sum",
    "partial",
    "(A + c) + x = (A + x) + c, where a rank holds a partial sum of A",
    '(rule ((= Y (Bin "add" (Bin "add" A C) X)) (psum A a s e K)) ((union Y (Bin "add" (Bin "add" A X) C))))',
)
_rule(
    "term-cover-start-plain",
    "partial",
    "start a tiling of A + b's all-reduce inputs with a contribution to A that carries no term",
    "(rule ((pplus Y A q s2 e2 K) (psum A p 0 e K) (arin p)) ((coverb Y A (multiset-of p) e K 0)))",
)
_rule(
    "term-cover-start",
    "partial",
    "start a tiling of A + b's all-reduce inputs with the contribution that carries the term",
    "(rule ((pplus Y A p 0 e K) (arin p)) ((coverb Y A (multiset-of p) e K 1)))",
)
_rule(
    "term-cover-extend-plain",
    "partial",
    "extend a tiling by the next contribution to A (no term)",
    "(rule ((coverb Y A ms e K n) (psum A p e f K) (arin p)) ((coverb Y A (multiset-insert ms p) f K n)))",
)
_rule(
    "term-cover-extend",
    "partial",
    "extend a tiling that has no term yet by the next contribution carrying it",
    "(rule ((coverb Y A ms e K 0) (pplus Y A p e f K) (arin p)) ((coverb Y A (multiset-insert ms p) f K 1)))",
)
_rule(
    "all-reduce-of-tiling-with-term",
    "partial",
    "summing contributions that tile [0, K) of A, exactly one carrying the term b, gives A + b",
    "(rule ((coverb Y A ms K K 1) (= S (SumN ms))) ((union Y S)))",
)

# ---------------------------------------------------------------------------------------------
# vocabulary-parallel losses: the max over the classes, the target's logit
# ---------------------------------------------------------------------------------------------
_rule(
    "max-of-selection-is-partial",
    "loss",
    "the max over one range of the reduced dim is a partial max",
    '(rule ((= Y (Red "amax" X d k)) (= y (Red "amax" x d k)) (sel X x d (RCons s e (RNil))) (= K (sz X d))) '
    "((pmax Y y s e K)))",
)
_rule(
    "max-cover-start",
    "loss",
    "collect partial maxes tiling [0, e) that feed an all-reduce",
    "(rule ((pmax Z p 0 e K) (arin p)) ((maxcover Z (multiset-of p) e K)))",
)
_rule(
    "max-cover-extend",
    "loss",
    "extend a tiling of partial maxes by the next contiguous one",
    "(rule ((maxcover Z ms e K) (pmax Z p e f K) (arin p)) ((maxcover Z (multiset-insert ms p) f K)))",
)
_rule(
    "all-reduce-max-of-tiling",
    "loss",
    "the max of partial maxes that tile [0, K) is the max",
    "(rule ((maxcover Z ms K K) (= M (MaxN ms))) ((union Z M)))",
)
_rule(
    "target-pick-is-partial",
    "loss",
    "picking the local ids of targets in [s, e) from classes [s, e), zero elsewhere, is their contribution",
    "(rule ((sel Z z d (RCons s e (RNil))) (outside m I s e) (localids l I s e) (= q (Pick z l d)) "
    '(= y (Fill q m "0.0")) (= Y (Pick Z I d)) (= K (sz Z d))) ((psum Y y s e K)))',
)
_rule(
    "local-ids-of-squeezed",
    "loss",
    "local ids are computed elementwise: squeezing the local ids of unsqueezed targets gives the local ids of "
    "the targets",
    "(rule ((localids l I s e) (= l2 (View l sh)) (vsqueeze l2 d) (= I (View I0 sh0)) (vunit I d)) "
    "((localids l2 I0 s e)))",
)
_rule(
    "target-pick-is-partial-unsqueezed",
    "loss",
    "as target-pick-is-partial, with the picks unsqueezed and zeroed by the mask of the unsqueezed targets "
    "(DTensor's masked partial): the contribution to the unsqueezed picks",
    "(rule ((sel Z z d2 (RCons s e (RNil))) (localids l I s e) (= q (Pick z l d2)) (= qv (View q sh)) (vunit qv d) "
    '(= Iv (View I shI)) (vunit Iv d) (outside mv Iv s e) (= y (Fill qv mv "0.0")) (= Y (Pick Z I d2)) '
    "(= YV (View Y sh)) (= K (sz Z d2))) ((psum YV y s e K)))",
)
_rule(
    "target-whole-range-pick",
    "loss",
    "local ids of the whole class range [0, K) are the targets themselves (targets are class indices)",
    "(rule ((localids l I 0 K) (= y (Pick Z l d)) (= K (sz Z d))) ((union y (Pick Z I d))))",
)
_rule(
    "target-whole-range-mask",
    "loss",
    "no target lies outside the whole class range [0, K): zeroing the picks of outside targets changes nothing",
    '(rule ((outside m I 0 K) (= Y (Pick Z I d)) (= K (sz Z d)) (= y (Fill Y m "0.0"))) ((union y Y)))',
)

_FACTS = r"""
(relation linear-unary (String))
(relation scaling (String))
(relation additive (String))
(relation multiplicative (String))
(relation additive-reduction (String))
(relation unit-reduction (String))
(relation negation (String))
(negation "bitwise_not") (negation "logical_not")
(linear-unary "neg")
(scaling "mul") (scaling "div") (scaling "rmul")
(additive "add") (additive "sub")
(multiplicative "mul") (multiplicative "div")
(additive-reduction "sum") (additive-reduction "mean")
(unit-reduction "sum") (unit-reduction "mean") (unit-reduction "amax") (unit-reduction "amin")
(unit-reduction "prod") (unit-reduction "logsumexp")
"""


def all_rules() -> tuple[Rule, ...]:
    from .index_sets import INDEX_SET_RULES  # defined there by concern; it builds on Rule

    return tuple(_RULES) + tuple(INDEX_SET_RULES)


def opaque_ops() -> frozenset[str]:
    """The operations rules match as opaque calls (`(Op2 "aten::embedding_dense_backward" ...)`): the
    normalizer keeps them whole instead of writing out their decomposition."""
    import re

    return frozenset(re.findall(r'\(Op\d "([^"#]+)', "\n".join(rule.text for rule in all_rules())))


def fact_text() -> str:
    """The op-class facts (which unary ops are linear, which binary ops additive, ...)."""
    return _FACTS


def program_text() -> str:
    """Declarations of the op-class facts, the rulesets and every rule."""
    lines = [_FACTS]
    lines.extend(f"(ruleset {family})" for family in FAMILIES)
    lines.extend(rule.command() for rule in all_rules())
    return "\n".join(lines)


def casts_are_linear(dtypes: set[str]) -> str:
    """Facts declaring the casts to floating dtypes seen in a program linear (real-number semantics:
    they only round). Casts to integer or boolean dtypes truncate, and the truncations of partial
    sums do not add up to the truncation of their sum, so they are not linear."""
    return "\n".join(f'(linear-unary "cast_{dtype}")' for dtype in sorted(dtypes) if _is_floating(dtype))


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def schedule(iterations: int) -> str:
    saturated = " ".join(f"(saturate (run {f}))" for f in SATURATED_FAMILIES)
    passes = " ".join(f"(run {f})" for f in FAMILIES if f not in SATURATED_FAMILIES)
    return f"(run-schedule (repeat {iterations} (seq {saturated} {passes})))"
