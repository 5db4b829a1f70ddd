"""The rule library, as data: every rule has a name, a family (its ruleset), its egglog text and
what it means. Families run in the order of `FAMILIES`; `ranges` and `shapes` run to saturation
before every pass of the others.

Soundness: each relation rule derives a fact that holds by the semantics of the ops it matches
(see language.py for what each relation means); each rewrite states an identity of tensor
algebra. Side conditions are exact integer conditions on shapes and ranges, never approximations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

RULE_LIBRARY_VERSION = "53"


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


def registrar(into: list[Rule]) -> Callable[[str, str, str, str], None]:
    """`_rule(name, family, meaning, text)` for a module of rules: each call adds one to `into`."""

    def register(name: str, family: str, meaning: str, text: str) -> None:
        into.append(Rule(name, family, text, meaning))

    return register


_rule = registrar(_RULES)


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
    "slice-of-concat-across",
    "concat",
    "a slice across the boundary of two pieces is the concatenation of its parts in each (an output written a "
    "block at a time by slice assignments: each write keeps the written blocks before it as one slice)",
    "(rewrite (Slice (Cat a b d) d s e) (Cat (Slice a d s na) (Slice b d 0 (- e na)) d) "
    ":when ((= na (sz a d)) (< s na) (< na e)))",
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
    "a selection inside the reference's own slice is a selection of it (a slice a program computes: one "
    "that rules or twins write pairs with every rank's selection of its source, most of them outside it)",
    "(rule ((sel X x d R) (= Y (Slice X d a b)) (node Y v)) ((selp Y x d (RClip R a b))))",
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
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di R) (vkeep Y di do k sX) (vkeep y di do k sx) "
    "(vshape X sX) (vshape x sx)) ((sel Y y do R)))",
)
_rule(
    "view-split",
    "layout",
    "splitting a dim (heads x head_dim): selections aligned to the inner size",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di R) (vsplit Y di do h k sX) (vsplit y di do h k sx) "
    "(vshape X sX) (vshape x sx)) "
    "((selp Y y do (RDiv R h))))",
)
_rule(
    "view-merge",
    "layout",
    "merging an outer dim into the next: selections scale by the inner size",
    "(rule ((= Y (View X s1)) (= y (View x s2)) (sel X x di R) (vmerge Y di do h k sX) (vmerge y di do h k sx) "
    "(vshape X sX) (vshape x sx)) "
    "((selp Y y do (RMul R h))))",
)
_rule(
    "permute-moves-selection",
    "layout",
    "a permutation moves the selected dim",
    "(rule ((= Y (Permute X p)) (= y (Permute x p)) (sel X x di R) (pmap p di do)) ((sel Y y do R)))",
)
_rule(
    "permute-of-selection",
    "layout",
    "a permutation of a rank's block of a permuted value moves the selected dim (the reference's permutation is "
    "made if it does not exist: a rank may put the sequence first for a reduce-scatter and back after, the two "
    "permutations then compose to none)",
    "(rule ((= y (Permute x p)) (sel X x di R) (= X (Permute X0 q)) (pmap p di do)) ((sel (Permute X p) y do R)))",
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
    "expand-source-window",
    "layout",
    "a value of size 1 along the one dim its expansion broadcasts is any one-wide window of the expansion (a "
    "rank holding one head of a value the reference shares across its heads)",
    "(rule ((= Y (Expand X s)) (ebsrc Y d) (= K (sz Y d))) ((selw Y X d 0 (- K 1) 1)))",
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
    "repeat-once",
    "layout",
    "repeating every slice once, in place, is the value itself (`repeat_interleave(1)`: a computed repeat "
    "count that comes out 1)",
    "(rule ((= y (Rep x d 1))) ((union y x)))",
)
_rule(
    "repeat-fewer-copies",
    "layout",
    "m2 < m copies of one slice equal any m2 consecutive copies of it among the reference's m",
    "(rule ((= Y (Rep X d m)) (= y (Rep x d m2)) (sel X x d (RCons s (+ s 1) (RNil))) (< m2 m)) "
    "((selw Y y d (* s m) (- (+ (* s m) m) m2) m2)))",
)
_rule(
    "one-copy-of-a-repeated-slice",
    "layout",
    "one slice of a value is any one of the m copies of it in the value's repeat (a rank holding one key "
    "head, unrepeated, where the reference repeats every head to its query heads: Hugging Face's "
    "`repeat_kv` returns its input when the count is 1)",
    "(rule ((= Y (Rep X d m)) (sel X x d (RCons s (+ s 1) (RNil)))) ((selw Y x d (* s m) (- (+ (* s m) m) 1) 1)))",
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
    "(rule ((= Y (Permute X p)) (= y (Permute x p)) (selw X x di lo hi n) (pmap p di do)) ((selw Y y do lo hi n)))",
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
    "(rule ((= Y (Red f X d 0)) (= X (View x s)) (vunit X d sx) (vshape x sx) (unit-reduction f)) ((union Y x)))",
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
    "removing the size-1 dim a view inserted gives back the view's source (of the squeezed shape: the facts "
    "about X hold for its class, which may hold views of other values of its shape)",
    "(rule ((= y (View X sh)) (= X (View x sh0)) (vunit X d sh) (vsqueeze y d) (vshape x sh)) ((union y x)))",
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
    "linear-of-leading-slice",
    "matmul",
    "x[a:b] @ W^T = (x @ W^T)[a:b] along any dim but the last (a rank computing a block of the sequence at a "
    "time, with its own weight)",
    "(rewrite (Linear (Slice x d a b) w) (Slice (Linear x w) d a b) :when ((< d -1)))",
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
for _name, _side, _sliced, _whole in (
    ("matmul-batch-broadcast-left", "A", "(= y (Matmul a B)) (sel A a d R)", "B"),
    ("matmul-batch-broadcast-right", "B", "(= y (Matmul A b)) (sel B b d R)", "A"),
):
    _rule(
        _name,
        "matmul",
        f"a selection of a batch dim of {_side} is that selection of A @ B when the other operand lacks the "
        "dim (broadcast over it: a routing tensor [experts, 1, tokens] sliced per rank, times the tokens "
        "[tokens, hidden])",
        f"(rule ((= Y (Matmul A B)) {_sliced} (< d -2) (= n (nd {_whole})) (< (+ n d) 0)) ((sel Y y d R)))",
    )
for _name, _side, _window, _selected in (
    ("matmul-batch-window-right", "right", "B b", "A a"),
    ("matmul-batch-window-left", "left", "A a", "B b"),
):
    _rule(
        _name,
        "matmul",
        f"a batch slice of the {_side} operand replicated for a group (a key head repeated for the query heads "
        "that share it, in attention written out as matmuls), which the other operand's batch range [s, e) "
        "meets, is the selection [s, e) of the repeated operand (any window position is)",
        f"(rule ((= Y (Matmul A B)) (= y (Matmul a b)) (sel {_selected} d (RCons s e (RNil))) "
        f"(selw {_window} d lo hi n) (= n (- e s)) (<= lo s) (<= s hi)) ((sel {_window} d (RCons s e (RNil)))))",
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

_FACTS = r"""
(relation linear-unary (String))
(relation real-cast (String))
(relation scaling (String))
(relation additive (String))
(relation multiplicative (String))
(relation additive-reduction (String))
(relation unit-reduction (String))
(relation negation (String))
(relation scprod (String String String))
(relation scprodrecip (String String i64))
(relation scintprod (i64 i64 i64))
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
    # the families defined by concern in their own modules, which build on Rule
    from .index_sets import INDEX_SET_RULES
    from .rules_convolutions import CONVOLUTION_RULES
    from .rules_elementwise import ELEMENTWISE_RULES
    from .rules_permutations import PERMUTATION_RULES
    from .rules_ranges import RANGE_RULES
    from .rules_reductions import REDUCTION_RULES
    from .rules_scalars import SCALAR_RULES

    return (
        tuple(RANGE_RULES)
        + tuple(_RULES)
        + tuple(ELEMENTWISE_RULES)
        + tuple(PERMUTATION_RULES)
        + tuple(REDUCTION_RULES)
        + tuple(INDEX_SET_RULES)
        + tuple(SCALAR_RULES)
        + tuple(CONVOLUTION_RULES)
    )


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
    floating = [dtype for dtype in sorted(dtypes) if _is_floating(dtype)]
    return "\n".join(f'(linear-unary "cast_{dtype}") (real-cast "cast_{dtype}")' for dtype in floating)


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def schedule(iterations: int) -> str:
    saturated = " ".join(f"(saturate (run {f}))" for f in SATURATED_FAMILIES)
    passes = " ".join(f"(run {f})" for f in FAMILIES if f not in SATURATED_FAMILIES)
    return f"(run-schedule (repeat {iterations} (seq {saturated} {passes})))"
