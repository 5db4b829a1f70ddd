"""How to instantiate each rule: the free values of its pattern, drawn at random for one rank of a world.

`INSTANCES[name]` binds values that satisfy the rule's side conditions; the harness derives the
rest from the premises and checks them. `NEAR_MISSES[name]` (for every rule with side conditions)
binds values one side condition rejects (an off-by-one slice, the selected dim equal to the
reduced one, a non-linear op, a mask broadcast along the wrong dim) and on which the conclusion
would be false. A rule added to the library without an entry here fails the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .generation import Gen, Recipe
from .harness import class_facts
from .meaning import indices, range_list

INSTANCES: dict[str, Recipe] = {}
NEAR_MISSES: dict[str, Recipe] = {}

_ATTRS = '{"enable_gqa": false, "is_causal": %s, "scale": null}'


def instance(*names: str) -> Callable[[Recipe], Recipe]:
    def register(recipe: Recipe) -> Recipe:
        for name in names:
            assert name not in INSTANCES, name
            INSTANCES[name] = recipe
        return recipe

    return register


def near_miss(*names: str) -> Callable[[Recipe], Recipe]:
    def register(recipe: Recipe) -> Recipe:
        for name in names:
            assert name not in NEAR_MISSES, name
            NEAR_MISSES[name] = recipe
        return recipe

    return register


def instance_and_near_miss(name: str, make: Callable[[Gen, bool], dict[str, Any]]) -> None:
    """Register make(g, False) as the instance and make(g, True) as the near miss of a rule."""
    instance(name)(lambda g: make(g, False))
    near_miss(name)(lambda g: make(g, True))


def _members(relation: str) -> list[str]:
    return sorted(value for kind, value in class_facts() if kind == relation)


def _within(g: Gen, low: int, high: int, most: int = 2) -> tuple:
    """Ranges inside [low, high)."""
    term = g.selection(high - low, most)
    return range_list([(s + low, e + low) for s, e in _pairs(term)])


def _pairs(term: tuple) -> list[tuple[int, int]]:
    pairs = []
    while term[0] == "RCons":
        pairs.append((term[1], term[2]))
        term = term[3]
    return pairs


def _scrambled_whole(g: Gen, n: int) -> tuple:
    """All of [0, n) out of order: a selection as large as the dim that still moves every index."""
    cut = g.int(1, n - 1)
    return range_list([(cut, n), (0, cut)])


def _two_or_more(g: Gen, n: int) -> tuple:
    """A selection of [0, n) with at least two indices: one index would be a unit dim, which a view
    may place elsewhere, and then the view's dim facts differ between reference and rank."""
    ranges = g.selection(n)
    return ranges if len(indices(ranges)) > 1 else range_list([(0, 2)])


def _shape(g: Gen, nd: int, low: int = 2, high: int = 5) -> list[int]:
    return [g.int(low, high) for _ in range(nd)]


# ---------------------------------------------------------------------------------------------
# ranges
# ---------------------------------------------------------------------------------------------
@instance("range-append-nil")
def _(g: Gen) -> dict[str, Any]:
    return {"r": g.selection(9)}


@instance("range-append-cons")
def _(g: Gen) -> dict[str, Any]:
    s = g.int(0, 6)
    return {"s": s, "e": s + g.int(0, 4), "t": g.selection(9), "r": g.selection(9)}


@instance("range-shift-nil", "range-mul-nil", "range-div-nil")
def _(g: Gen) -> dict[str, Any]:
    return {"k": g.int(1, 5)}


@instance("range-shift-cons", "range-mul-cons")
def _(g: Gen) -> dict[str, Any]:
    s = g.int(0, 6)
    return {"s": s, "e": s + g.int(1, 4), "t": g.selection(9), "k": g.int(1, 5)}


@instance("range-clip-nil")
def _(g: Gen) -> dict[str, Any]:
    a = g.int(0, 5)
    return {"a": a, "b": a + g.int(0, 5)}


@instance("range-clip-cons")
def _(g: Gen) -> dict[str, Any]:
    a = g.int(0, 4)
    b = a + g.int(3, 9)
    s = g.int(a, b - 1)
    return {"s": s, "e": g.int(s + 1, b), "t": _within(g, a, b), "a": a, "b": b}


@near_miss("range-clip-cons")
def _(g: Gen) -> dict[str, Any]:
    # the first range reaches one past the window
    a = g.int(0, 4)
    b = a + g.int(3, 9)
    s = g.int(a, b - 1)
    return {"s": s, "e": b + 1, "t": _within(g, a, b), "a": a, "b": b}


@instance("range-div-cons")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(1, 4)
    i = g.int(0, 3)
    blocks = _pairs(g.selection(5))
    return {"s": i * k, "e": (i + g.int(1, 3)) * k, "t": range_list([(s * k, e * k) for s, e in blocks]), "k": k}


@near_miss("range-div-cons")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(2, 4)
    i = g.int(0, 3)
    return {"s": i * k + 1, "e": (i + 2) * k, "t": ("RNil",), "k": k}


@instance("range-sub-empty")
def _(g: Gen) -> dict[str, Any]:
    r = g.selection(9)
    return {"r": r, "a": g.int(0, len(indices(r)))}


def _first_and_rest(g: Gen) -> tuple[int, int, tuple]:
    s = g.int(0, 5)
    e = s + g.int(2, 5)
    rest = _within(g, e + 1, e + 9)  # not adjacent to the first range
    return s, e, rest


@instance("range-sub-inside")
def _(g: Gen) -> dict[str, Any]:
    s, e, t = _first_and_rest(g)
    a = g.int(0, e - s - 1)
    return {"s": s, "e": e, "t": t, "a": a, "b": g.int(a + 1, e - s)}


@near_miss("range-sub-inside")
def _(g: Gen) -> dict[str, Any]:
    s, e, t = _first_and_rest(g)
    return {"s": s, "e": e, "t": t, "a": 0, "b": e - s + 1}  # one past the first range


@instance("range-sub-skip")
def _(g: Gen) -> dict[str, Any]:
    s, e, t = _first_and_rest(g)
    n = len(indices(t))
    a = g.int(e - s, e - s + n - 1)
    return {"s": s, "e": e, "t": t, "a": a, "b": g.int(a + 1, e - s + n)}


@near_miss("range-sub-skip")
def _(g: Gen) -> dict[str, Any]:
    s, e, t = _first_and_rest(g)
    return {"s": s, "e": e, "t": t, "a": e - s - 1, "b": e - s + 1}  # starts one inside the first range


@instance("range-sub-straddle")
def _(g: Gen) -> dict[str, Any]:
    s, e, t = _first_and_rest(g)
    n = len(indices(t))
    return {"s": s, "e": e, "t": t, "a": g.int(0, e - s - 1), "b": g.int(e - s + 1, e - s + n)}


@near_miss("range-sub-straddle")
def _(g: Gen) -> dict[str, Any]:
    s, e, t = _first_and_rest(g)
    return {"s": s, "e": e, "t": t, "a": e - s + 1, "b": e - s + 2}  # entirely past the first range


@instance("range-compose-nil")
def _(g: Gen) -> dict[str, Any]:
    return {"r": g.selection(9)}


@instance("range-compose-cons")
def _(g: Gen) -> dict[str, Any]:
    r = g.selection(12)
    n = len(indices(r))
    a = g.int(0, n - 1)
    return {"r": r, "a": a, "b": g.int(a, n), "t": g.selection(n)}


@instance("range-merge-adjacent")
def _(g: Gen) -> dict[str, Any]:
    s = g.int(0, 4)
    e = s + g.int(0, 3)
    return {"s": s, "e": e, "f": e + g.int(0, 3), "t": _within(g, e + 4, e + 12)}


@instance("range-evaluated-nil")
def _(g: Gen) -> dict[str, Any]:
    return {}


@instance("range-evaluated-cons")
def _(g: Gen) -> dict[str, Any]:
    s = g.int(0, 4)
    return {"s": s, "e": s + g.int(1, 3), "t": g.selection(9)}


@instance("pending-selection-evaluated")
def _(g: Gen) -> dict[str, Any]:
    n = g.int(3, 8)
    return {"X": g.tensor(3, n, 2), "d": -2, "R": g.selection(n)}


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------
def _slice_of(g: Gen) -> dict[str, Any]:
    shape = _shape(g, 3)
    d = g.int(-3, -1)
    s = g.int(0, shape[d] - 1)
    return {"x": g.tensor(*shape), "d": d, "s": s, "e": g.int(s, shape[d])}


@instance("shape-slice-dim")
def _(g: Gen) -> dict[str, Any]:
    return _slice_of(g)


@instance("shape-slice-other")
def _(g: Gen) -> dict[str, Any]:
    bindings = _slice_of(g)
    return bindings | {"d2": g.pick(d for d in (-3, -2, -1) if d != bindings["d"])}


@near_miss("shape-slice-other")
def _(g: Gen) -> dict[str, Any]:
    bindings = _slice_of(g)
    n = bindings["x"].shape[bindings["d"]]
    return bindings | {"s": 0, "e": n - 1, "d2": bindings["d"]}  # the sliced dim itself


def _cat_of(g: Gen) -> dict[str, Any]:
    shape = _shape(g, 3)
    d = g.int(-3, -1)
    other = list(shape)
    other[d] = g.int(1, 4)
    return {"a": g.tensor(*shape), "b": g.tensor(*other), "d": d}


@instance("shape-cat-dim")
def _(g: Gen) -> dict[str, Any]:
    return _cat_of(g)


@instance("shape-cat-other")
def _(g: Gen) -> dict[str, Any]:
    bindings = _cat_of(g)
    return bindings | {"d2": g.pick(d for d in (-3, -2, -1) if d != bindings["d"])}


@near_miss("shape-cat-other")
def _(g: Gen) -> dict[str, Any]:
    bindings = _cat_of(g)
    return bindings | {"d2": bindings["d"]}


@instance("shape-linear-out", "shape-linear-batch", "linear-of-row-concat")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(2, 5)
    return {
        "x": g.tensor(g.int(1, 3), g.int(2, 4), k),
        "w": g.tensor(g.int(2, 6), k),
        "a": g.tensor(g.int(1, 4), k),
        "b": g.tensor(g.int(1, 4), k),
        "d": g.pick((-2, -3)),
    }


@near_miss("shape-linear-batch")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(2, 5)
    return {"x": g.tensor(2, 3, k), "w": g.tensor(k + 1, k), "d": -1}  # the feature dim is not a batch dim


# ---------------------------------------------------------------------------------------------
# concat and slicing
# ---------------------------------------------------------------------------------------------
def _two_pieces(g: Gen) -> dict[str, Any]:
    bindings = _cat_of(g)
    bindings["a"] = g.tensor(*[max(n, 3) if i == 3 + bindings["d"] else n for i, n in enumerate(bindings["a"].shape)])
    return bindings


@instance("slice-of-concat-first")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    return bindings | {"n": bindings["a"].shape[bindings["d"]]}


@near_miss("slice-of-concat-first")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    return bindings | {"n": bindings["a"].shape[bindings["d"]] + 1}


@instance("slice-of-concat-inside-first")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    na = bindings["a"].shape[bindings["d"]]
    s = g.int(1, na - 1)
    return bindings | {"s": s, "e": g.int(s, na)}


@near_miss("slice-of-concat-inside-first")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    na = bindings["a"].shape[bindings["d"]]
    return bindings | {"s": g.int(1, na - 1), "e": na + 1}  # one past the first piece


@instance("slice-of-concat-inside-first-start")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    return bindings | {"e": g.int(0, bindings["a"].shape[bindings["d"]] - 1)}


@near_miss("slice-of-concat-inside-first-start")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    return bindings | {"e": bindings["a"].shape[bindings["d"]] + 1}


@instance("slice-of-concat-second")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    na, nb = bindings["a"].shape[bindings["d"]], bindings["b"].shape[bindings["d"]]
    s = g.int(na, na + nb)
    return bindings | {"s": s, "e": g.int(s, na + nb)}


@near_miss("slice-of-concat-second")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    na, nb = bindings["a"].shape[bindings["d"]], bindings["b"].shape[bindings["d"]]
    return bindings | {"s": na - 1, "e": na + nb}  # starts one inside the first piece


@instance("slice-whole")
def _(g: Gen) -> dict[str, Any]:
    bindings = _slice_of(g)
    return {"x": bindings["x"], "d": bindings["d"], "n": bindings["x"].shape[bindings["d"]]}


@near_miss("slice-whole")
def _(g: Gen) -> dict[str, Any]:
    bindings = _slice_of(g)
    return {"x": bindings["x"], "d": bindings["d"], "n": bindings["x"].shape[bindings["d"]] - 1}


@instance("slice-is-selection")
def _(g: Gen) -> dict[str, Any]:
    bindings = _slice_of(g)
    return {"X": bindings["x"], "d": bindings["d"], "s": bindings["s"], "e": bindings["e"]}


def _selected(g: Gen, nd: int = 3) -> dict[str, Any]:
    """A reference value X and a selection R of its dim d (a rank's shard, or fused pieces)."""
    shape = _shape(g, nd)
    d = g.int(-nd, -1)
    shape[d] = g.int(3, 9)
    return {"X": g.tensor(*shape), "d": d, "R": g.selection(shape[d])}


@instance("full-selection-is-equal")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    return bindings | {"n": bindings["X"].shape[bindings["d"]]}


@near_miss("full-selection-is-equal")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    return bindings | {"n": bindings["X"].shape[bindings["d"]] - 1}  # all but the last index


@instance("slice-of-selection")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    n = len(indices(bindings["R"]))
    a = g.int(0, n)
    return bindings | {"a": a, "b": g.int(a, n)}


@instance("selection-within-slice")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    n = bindings["X"].shape[bindings["d"]]
    a = g.int(0, n - 2)
    b = g.int(a + 1, n)
    return bindings | {"R": _within(g, a, b), "a": a, "b": b}


def _other_dim_slice(g: Gen, same_dim: bool) -> dict[str, Any]:
    bindings = _selected(g)
    d2 = bindings["d"] if same_dim else g.pick(d for d in (-3, -2, -1) if d != bindings["d"])
    n = bindings["X"].shape[d2]
    if same_dim:  # the whole dim, scrambled, so that slicing the rank value is defined
        bindings["R"] = _scrambled_whole(g, n)
    a = g.int(0, n - 2)
    return bindings | {"d2": d2, "a": a, "b": g.int(a + 1, n)}


instance_and_near_miss("slice-other-dim", _other_dim_slice)
instance_and_near_miss("slice-other-dim-of-reference", _other_dim_slice)


@instance("concat-of-selections")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    n = bindings["X"].shape[bindings["d"]]
    return {"X": bindings["X"], "d": bindings["d"], "Ra": g.selection(n), "Rb": g.selection(n)}


def _pieces_of_a_fused_value(g: Gen, along: int | None = None) -> dict[str, Any]:
    shape = _shape(g, 3)
    d = g.int(-3, -1) if along is None else along
    shape_b = list(shape)
    shape[d], shape_b[d] = g.int(2, 6), g.int(2, 6)
    return {"A": g.tensor(*shape), "B": g.tensor(*shape_b), "d": d}


@instance("concat-piecewise")
def _(g: Gen) -> dict[str, Any]:
    bindings = _pieces_of_a_fused_value(g)
    d = bindings["d"]
    return bindings | {"Ra": g.selection(bindings["A"].shape[d]), "Rb": g.selection(bindings["B"].shape[d])}


@instance("concat-piecewise-left-equal")
def _(g: Gen) -> dict[str, Any]:
    bindings = _pieces_of_a_fused_value(g)
    return bindings | {"Rb": g.selection(bindings["B"].shape[bindings["d"]])}


@instance("concat-piecewise-right-equal")
def _(g: Gen) -> dict[str, Any]:
    bindings = _pieces_of_a_fused_value(g)
    return bindings | {"Ra": g.selection(bindings["A"].shape[bindings["d"]])}


def _concat_other_dim(g: Gen, same_dim: bool) -> dict[str, Any]:
    d = g.int(-3, -1)
    d2 = d if same_dim else g.pick(x for x in (-3, -2, -1) if x != d)
    shape = _shape(g, 3)
    shape[d] = g.int(3, 6)
    shape_b = list(shape)
    if not same_dim:
        shape_b[d2] = g.int(1, 4)
    return {"A": g.tensor(*shape), "B": g.tensor(*shape_b), "d": d, "d2": d2, "R": g.selection(shape[d])}


instance_and_near_miss("concat-other-dim", _concat_other_dim)


# ---------------------------------------------------------------------------------------------
# reductions, normalisation, softmax
# ---------------------------------------------------------------------------------------------
_REDUCTION_NAMES = ("sum", "mean", "amax", "amin", "prod", "logsumexp", "argmax", "argmin")


def _reduced(g: Gen, relation: str, keepdim: int) -> dict[str, Any]:
    bindings = _selected(g)
    d2 = bindings.pop("d")
    choices = {
        "other": [d for d in (-3, -2, -1) if d != d2],
        "inner": [d for d in (-3, -2, -1) if d > d2],
        "outer": [d for d in (-3, -2, -1) if d < d2],
        "same": [d2],
    }[relation]
    if not choices:  # the selected dim has no dim on that side: select another one
        d2 = -3 if relation == "inner" else -1
        bindings["X"] = g.tensor(4, 5, 6)
        bindings["R"] = g.selection(bindings["X"].shape[d2])
        choices = [-2]
    if relation == "same":
        bindings["R"] = _scrambled_whole(g, bindings["X"].shape[d2])
    return bindings | {"d": g.pick(choices), "d2": d2, "f": g.pick(_REDUCTION_NAMES), "k": keepdim}


@instance("reduce-other-dim-keepdim")
def _(g: Gen) -> dict[str, Any]:
    return _reduced(g, "other", 1)


@near_miss("reduce-other-dim-keepdim")
def _(g: Gen) -> dict[str, Any]:
    return _reduced(g, "same", 1)


@instance("reduce-inner-dim")
def _(g: Gen) -> dict[str, Any]:
    return _reduced(g, "inner", 0)


@instance("reduce-outer-dim")
def _(g: Gen) -> dict[str, Any]:
    return _reduced(g, "outer", 0)


@near_miss("reduce-inner-dim", "reduce-outer-dim")
def _(g: Gen) -> dict[str, Any]:
    return _reduced(g, "same", 0)


@instance("sum-of-selection-is-partial", "max-of-selection-is-partial")
def _(g: Gen) -> dict[str, Any]:
    n = g.int(4, 9)
    shape = _shape(g, 3)
    d = g.int(-3, -1)
    shape[d] = n
    s, e = g.tile(n)
    return {"X": g.tensor(*shape), "d": d, "k": g.int(0, 1), "s": s, "e": e}


@instance("softmax-other-dim", "log-softmax-other-dim")
def _(g: Gen) -> dict[str, Any]:
    bindings = _reduced(g, "other", 0)
    return {"X": bindings["X"], "d": bindings["d"], "d2": bindings["d2"], "R": bindings["R"]}


@instance("along-other-dim")
def _(g: Gen) -> dict[str, Any]:
    bindings = _reduced(g, "other", 0)
    f, a = g.pick((("cumsum#0", "[]"), ("topk#0", "[2]"), ("topk#1", "[2]")))
    return {"X": bindings["X"], "d": bindings["d"], "d2": bindings["d2"], "R": bindings["R"], "f": f, "a": a}


@near_miss("along-other-dim")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    n = bindings["X"].shape[bindings["d"]]
    return bindings | {"d2": bindings["d"], "R": g.selection(n, most=1), "f": "cumsum#0", "a": "[]"}


@near_miss("softmax-other-dim", "log-softmax-other-dim")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    return bindings | {"d2": bindings["d"], "R": g.selection(bindings["X"].shape[bindings["d"]], most=1)}


# Instances of other concerns live in their own modules (they import the helpers above); importing
# them registers their recipes.
from . import (  # noqa: E402, F401
    contraction_instances,
    convolution_instances,
    elementwise_instances,
    gradient_instances,
    index_set_instances,
    layout_instances,
    permutation_instances,
    reduction_instances,
    scalar_instances,
    slice_instances,
)
