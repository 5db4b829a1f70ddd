"""Rules of the range-list algebra and of shapes: the families `ranges` and `shapes`, run to
saturation before every pass of the others (see rules.py for the library, and language.py for
what a range list means)."""

from __future__ import annotations

from .rules import Rule, registrar

RANGE_RULES: list[Rule] = []


_rule = registrar(RANGE_RULES)


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
