"""Elementwise rules (family `elementwise`): an elementwise operation keeps the selections,
windows and broadcasts of its operands, and sums regrouped where the reference groups them
otherwise."""

from __future__ import annotations

from .rules import Rule, registrar

ELEMENTWISE_RULES: list[Rule] = []

_rule = registrar(ELEMENTWISE_RULES)

_rule(
    "unary-keeps-selection",
    "elementwise",
    "f(X)[R] = f(X[R]) for elementwise f",
    "(rule ((= Y (Un f X)) (= y (Un f x)) (sel X x d R)) ((sel Y y d R)))",
)
_rule(
    "unary-of-view",
    "elementwise",
    "an elementwise op on a view of m is the view of the op on m (GPT-2's Conv1D views its output back to 3 "
    "dims before the activation, a rank that stays flat does not)",
    "(rule ((= n (Un f u)) (= u (View m sh)) (vshape m s0) (= k (nd m))) "
    "((union n (View (Un f m) sh)) (set (nd (Un f m)) k) (vshape (Un f m) s0)))",
)
_rule(
    "binary-of-views",
    "elementwise",
    "an elementwise op on two values of one shape, both viewed to one shape, is the view of the op on them "
    "(a rank that keeps a reduced dim computes m + log(s) on [n, 1] values and squeezes after, where the "
    "reference adds the [n] values)",
    "(rule ((= n (Bin f u w)) (= u (View a sh)) (= w (View b sh)) (vshape a s0) (vshape b s0) (= k (nd a))) "
    "((union n (View (Bin f a b) sh)) (set (nd (Bin f a b)) k) (vshape (Bin f a b) s0)))",
)
_rule(
    "floating-cast-keeps-the-value",
    "elementwise",
    "a cast to a floating dtype is its input's value (real-number semantics: it only rounds), so a rank that "
    "sums its partial sums in float64 and casts the total back computes the value itself",
    "(rule ((= y (Un f x)) (real-cast f)) ((union y x)))",
)
# Functions written out as their definitions (Megatron's and Mamba's `x * torch.sigmoid(x)`, a
# norm's `x / torch.sqrt(v)`) are the library's function of the same argument.
_rule(
    "silu-is-x-times-sigmoid",
    "elementwise",
    "silu(x) = x * sigmoid(x)",
    '(rule ((= y (Un "silu" x))) ((union y (Bin "mul" x (Un "sigmoid" x)))))',
)
_rule(
    "division-by-one-plus-exp-of-negation-is-sigmoid",
    "elementwise",
    "a / (1 + exp(-g)) = a * sigmoid(g): the logistic function written out (`g / (1 + torch.exp(-g))` as silu)",
    '(rule ((= y (Bin "div" a d)) (= d (ScI "add" (Un "exp" (Un "neg" g)) 1))) '
    '((union y (Bin "mul" a (Un "sigmoid" g)))))',
)
_rule(
    "reciprocal-of-one-plus-exp-of-negation-is-sigmoid",
    "elementwise",
    "1 / (1 + exp(-g)) = sigmoid(g)",
    '(rule ((= y (Un "reciprocal" d)) (= d (ScI "add" (Un "exp" (Un "neg" g)) 1))) ((union y (Un "sigmoid" g))))',
)
_rule(
    "subtracting-a-negation-is-adding",
    "elementwise",
    "a - (-b) = a + b, broadcasting alike",
    '(rule ((= y (Bin "sub" a n)) (= n (Un "neg" b))) ((union y (Bin "add" a b))))',
)
_rule(
    "adding-a-negation-is-subtracting",
    "elementwise",
    "a + (-b) = a - b, broadcasting alike",
    '(rule ((= y (Bin "add" a n)) (= n (Un "neg" b))) ((union y (Bin "sub" a b))))',
)
_rule(
    "reversed-difference-is-negated",
    "elementwise",
    "a - b = -(b - a), broadcasting alike (a smoothing term written `- eps * (c - b)` where the reference "
    "adds `eps * (b - c)`); stated at differences a program computes",
    '(rule ((= y (Bin "sub" a b)) (node y v)) ((union y (Un "neg" (Bin "sub" b a)))))',
)
_rule(
    "square-is-self-product",
    "elementwise",
    "square(x) = x * x (`lse.square()` where another program writes `lse * lse`)",
    '(rule ((= y (Un "square" x))) ((union y (Bin "mul" x x))))',
)
_rule(
    "division-by-root-is-reciprocal-root",
    "elementwise",
    "a / sqrt(v) = a * rsqrt(v)",
    '(rule ((= y (Bin "div" a r)) (= r (Un "sqrt" v))) ((union y (Bin "mul" a (Un "rsqrt" v)))))',
)
# A quotient times a value is the product divided (verl's entropy sums exp(l - m) * l and divides
# by the sum of the exponentials after its all-reduce; the reference multiplies the softmax, a
# quotient, by l), and a sum of quotients by one divisor along the summed dim is the divided sum.
_rule(
    "product-of-quotient",
    "elementwise",
    "(a / s) * b = (a * b) / s, broadcasting alike",
    '(rule ((= y (Bin "mul" q b)) (= q (Bin "div" a s))) ((union y (Bin "div" (Bin "mul" a b) s))))',
)
_rule(
    "product-of-quotient-sizes",
    "elementwise",
    "the product a * b that product-of-quotient makes has the size a and b share along a dim (the rules "
    "that read a rank's block of it need its sizes)",
    '(rule ((= y (Bin "mul" q b)) (= q (Bin "div" a s)) (= n (sz a d)) (= n (sz b d))) '
    '((set (sz (Bin "mul" a b) d) n)))',
)
_rule(
    "sum-of-quotients-by-one-divisor",
    "elementwise",
    "sum_d(x / s) = sum_d(x) / s, keeping d, when s has size 1 along d (one divisor per row)",
    '(rule ((= y (Red "sum" q d 1)) (= q (Bin "div" x s)) (= 1 (sz s d))) ((union y (Bin "div" (Red "sum" x d 1) s))))',
)
_rule(
    "unary-keeps-sizes",
    "elementwise",
    "an elementwise op keeps its input's sizes",
    "(rule ((= y (Un f x)) (= n (sz x d))) ((set (sz y d) n)))",
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
    "product-commutes",
    "elementwise",
    "a * b = b * a, broadcasting alike (a norm's weight times the normalised value, or the value times the weight)",
    '(rule ((= y (Bin "mul" a b))) ((union y (Bin "mul" b a))))',
)
_rule(
    "sum-commutes",
    "elementwise",
    "a + b = b + a, broadcasting alike (a residual added to the block's output, or the output to the "
    "residual; a bias after the value, or the value after the bias); stated at sums a program computes: "
    "commuting every sum the rules make cost 20% of the saturation at 64 ranks",
    '(rule ((= y (Bin "add" a b)) (node y v)) ((union y (Bin "add" b a))))',
)
_rule(
    "regroup-selected-product",
    "elementwise",
    "g * (a * r) = (g * a) * r: a rank scaling its block by a replicated factor and then by its block of a "
    "weight, where the reference multiplies the weight and the value first (`weight * x * rsqrt(...)`)",
    '(rule ((= y (Bin "mul" g ar)) (= ar (Bin "mul" a r)) (sel G g d R) (sel X a d R) (= Y (Bin "mul" GX r)) '
    '(= GX (Bin "mul" G X))) ((union y (Bin "mul" (Bin "mul" g a) r))))',
)
_rule(
    "regroup-sum-as-written-elsewhere",
    "elementwise",
    "(a + c) + b = a + (c + b), where the other grouping is already a term (the reference adds the bias to "
    "the layer's output before the residual, a rank after it)",
    '(rule ((= y (Bin "add" (Bin "add" a c) b)) (= Y (Bin "add" a (Bin "add" c b)))) ((union y Y)))',
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
# A pick reads, row by row, the entry its index names along its dim: a selection of the rows
# (any other dim) of both the picked value and the indices is that selection of the picks (a
# rank's block of the tokens: its logits and its targets, under context or data parallelism).
# The index has the picked value's dims without the picked one, so a dim left of it is one
# further right among the index's (negative) dims.
_rule(
    "pick-keeps-selection-outer",
    "elementwise",
    "pick(X, I, d)[R along d2] = pick(X[R along d2], I[R along d2 + 1], d) for a dim d2 left of d",
    "(rule ((= Y (Pick X I d)) (= y (Pick x i d)) (sel X x d2 R) (< d2 d) (sel I i e R) (= e (+ d2 1))) "
    "((sel Y y e R)))",
)
_rule(
    "pick-keeps-selection-inner",
    "elementwise",
    "pick(X, I, d)[R along d2] = pick(X[R along d2], I[R along d2], d) for a dim d2 right of d",
    "(rule ((= Y (Pick X I d)) (= y (Pick x i d)) (sel X x d2 R) (> d2 d) (sel I i d2 R)) ((sel Y y d2 R)))",
)
_rule(
    "where-all-selected",
    "elementwise",
    "where(C, A, B)[R] = where(C[R], A[R], B[R])",
    "(rule ((= Y (Where C A B)) (= y (Where c a b)) (sel C c d R) (sel A a d R) (sel B b d R)) ((sel Y y d R)))",
)

# -- a slice along a dim an op maps one to one is the slice of the op on the whole value: a rank
# that computes on blocks of the sequence (a chunk at a time, to overlap its reductions with the
# next chunk's compute) then has the terms of the whole value its blocks are blocks of
_rule(
    "unary-of-slice",
    "elementwise",
    "f(x[a:b]) = f(x)[a:b] for elementwise f",
    "(rewrite (Un f (Slice x d a b)) (Slice (Un f x) d a b))",
)
_rule(
    "scalar-of-slice",
    "elementwise",
    "f(x[a:b], c) = f(x, c)[a:b]",
    "(rewrite (Sc f (Slice x d a b) c) (Slice (Sc f x c) d a b))",
)
_rule(
    "binary-of-slice-and-broadcast",
    "elementwise",
    "f(x[a:b], c) = f(x, c)[a:b] when c has no dim d (it broadcasts along it)",
    "(rewrite (Bin f (Slice x d a b) c) (Slice (Bin f x c) d a b) "
    ":when ((= k (nd c)) (= n (nd x)) (< k (- 0 d)) (<= k n)))",
)
_rule(
    "slice-of-binary",
    "elementwise",
    "f(x, y)[a:b] = f(x[a:b], y[a:b]) along a dim both operands have whole (neither broadcasts along it: a "
    "fused projection's output plus its fused bias, split into q, k and v); stated at slices a program computes",
    "(rule ((= s (Slice (Bin f x y) d a b)) (node s v) (= n (sz x d)) (= n (sz y d))) "
    "((union s (Bin f (Slice x d a b) (Slice y d a b)))))",
)
_rule(
    "binary-of-broadcast-and-slice",
    "elementwise",
    "f(c, x[a:b]) = f(c, x)[a:b] when c has no dim d (it broadcasts along it)",
    "(rewrite (Bin f c (Slice x d a b)) (Slice (Bin f c x) d a b) "
    ":when ((= k (nd c)) (= n (nd x)) (< k (- 0 d)) (<= k n)))",
)
