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

from ..capture.lowering_tables import _BINARY, _UNARY
from .harness import Gen, Recipe, class_facts
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
# layout
# ---------------------------------------------------------------------------------------------
@instance("view-keep")
def _(g: Gen) -> dict[str, Any]:
    if g.int(0, 1):  # (A, N, C) -> (A, N, C1, C2): N is kept as dim -3
        a, n, c1, c2 = g.int(2, 3), g.int(3, 7), g.int(2, 3), g.int(2, 3)
        X, R = g.tensor(a, n, c1 * c2), _two_or_more(g, n)
        m = len(indices(R))
        return {"X": X, "di": -2, "do": -3, "R": R, "s1": g.text((a, n, c1, c2)), "s2": g.text((a, m, c1, c2))}
    n, c1, c2 = g.int(3, 7), g.int(2, 3), g.int(2, 3)  # (N, C1, C2) -> (N, C1*C2): N is kept as -2
    X, R = g.tensor(n, c1, c2), _two_or_more(g, n)
    m = len(indices(R))
    return {"X": X, "di": -3, "do": -2, "R": R, "s1": g.text((n, c1 * c2)), "s2": g.text((m, c1 * c2))}


@instance("view-split")
def _(g: Gen) -> dict[str, Any]:
    batch, heads, head_dim = g.int(1, 3), g.int(2, 6), g.int(2, 4)
    chosen = _pairs(_two_or_more(g, heads))
    R = range_list([(s * head_dim, e * head_dim) for s, e in chosen])
    local = sum(e - s for s, e in chosen)
    return {
        "X": g.tensor(batch, 3, heads * head_dim),
        "di": -1,
        "do": -2,
        "h": head_dim,
        "R": R,
        "s1": g.text((batch, 3, heads, head_dim)),
        "s2": g.text((batch, 3, local, head_dim)),
    }


@instance("view-merge")
def _(g: Gen) -> dict[str, Any]:
    batch, heads, head_dim = g.int(2, 3), g.int(3, 6), g.int(2, 4)
    R = _two_or_more(g, heads)
    local = len(indices(R))
    return {
        "X": g.tensor(batch, heads, head_dim),
        "di": -2,
        "do": -1,
        "h": head_dim,
        "R": R,
        "s1": g.text((batch, heads * head_dim)),
        "s2": g.text((batch, local * head_dim)),
    }


@instance("permute-moves-selection", "window-permute")
def _(g: Gen) -> dict[str, Any]:
    perm = [0, 1, 2, 3]
    g.random.shuffle(perm)
    di = g.int(-4, -1)
    if g.rule == "window-permute":
        bindings = _window(g, di, nd=4)
    else:
        shape = _shape(g, 4)
        shape[di] = g.int(3, 8)
        bindings = {"X": g.tensor(*shape), "R": g.selection(shape[di])}
    return bindings | {"p": g.text(perm), "di": di, "do": perm.index(di + 4) - 4}


def _expanded_selection(g: Gen, near: bool) -> dict[str, Any]:
    """A selection along d of a value broadcast along another dim (a near miss broadcasts the
    selected value to fewer copies than the whole one: a rank's heads of a shared key)."""
    n, m = g.int(3, 7), g.int(2, 4)
    R = g.selection(n)
    local = len(indices(R))
    m2 = m - 1 if near else m
    if g.int(0, 1):
        return {"X": g.tensor(1, n), "d": -1, "R": R, "s1": g.text((m, n)), "s2": g.text((m2, local))}
    return {"X": g.tensor(n, 1), "d": -2, "R": R, "s1": g.text((n, m)), "s2": g.text((local, m2))}


instance_and_near_miss("expand-keeps-selection", _expanded_selection)


@instance("repeat-scales-selection")
def _(g: Gen) -> dict[str, Any]:
    return _selected(g) | {"m": g.int(1, 4)}


def _repeat_other(g: Gen, same_dim: bool) -> dict[str, Any]:
    bindings = _selected(g)
    d = bindings.pop("d")
    d2 = d if same_dim else g.pick(x for x in (-3, -2, -1) if x != d)
    return bindings | {"d2": d, "d": d2, "m": g.int(2, 4)}


instance_and_near_miss("repeat-other-dim", _repeat_other)


@instance("repeat-once")
def _(g: Gen) -> dict[str, Any]:
    shape = _shape(g, g.int(1, 3))
    return {"x": g.tensor(*shape), "d": g.int(-len(shape), -1)}


@instance("repeat-fewer-copies")
def _(g: Gen) -> dict[str, Any]:
    kv_heads, m = g.int(2, 4), g.int(2, 4)
    return {"X": g.tensor(2, kv_heads, 3), "d": -2, "m": m, "m2": g.int(1, m - 1), "s": g.int(0, kv_heads - 1)}


@near_miss("repeat-fewer-copies")
def _(g: Gen) -> dict[str, Any]:
    kv_heads, m = g.int(2, 4), g.int(2, 4)
    return {"X": g.tensor(2, kv_heads, 3), "d": -2, "m": m, "m2": m + 1, "s": g.int(0, kv_heads - 2)}


@instance("one-copy-of-a-repeated-slice")
def _(g: Gen) -> dict[str, Any]:
    kv_heads = g.int(2, 4)
    return {"X": g.tensor(2, kv_heads, 3), "d": -2, "m": g.int(1, 4), "s": g.int(0, kv_heads - 1)}


def _window(g: Gen, d: int, nd: int = 3) -> dict[str, Any]:
    """X whose every group of m consecutive slices along d is equal (repeated KV heads), a window in one group."""
    groups, m = g.int(2, 3), g.int(2, 4)
    shape = _shape(g, nd)
    shape[d] = groups
    base = g.tensor(*shape)
    X = base.repeat_interleave(m, dim=d)
    n = g.int(1, m)
    lo = g.int(0, groups - 1) * m
    return {"X": X, "d": d, "lo": lo, "hi": g.int(lo, lo + m - n), "n": n}


def _window_slice(g: Gen, same_dim: bool) -> dict[str, Any]:
    d = g.int(-3, -1)
    bindings = _window(g, d)
    d2 = d if same_dim else g.pick(x for x in (-3, -2, -1) if x != d)
    n = bindings["X"].shape[d2]
    if same_dim:  # slicing the windowed dim itself: the window no longer lines up
        window = bindings["X"].shape[d] // 2 + 1
        return bindings | {"lo": 0, "hi": 0, "n": window, "d2": d, "a": 1, "b": window}
    a = g.int(0, n - 1)
    return bindings | {"d2": d2, "a": a, "b": g.int(a + 1, n)}


instance_and_near_miss("window-slice", _window_slice)


# ---------------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------------
_FLOAT_BINARY = sorted(set(_BINARY.values()) - {"or", "and", "xor"})


@instance("unary-keeps-selection", "unary-keeps-window")
def _(g: Gen) -> dict[str, Any]:
    ops = sorted(_UNARY) + [f"cast_{dtype}" for dtype in ("float32", "bfloat16", "int64", "bool")]
    f = g.pick(ops)
    bindings = _window(g, g.int(-3, -1)) if g.rule == "unary-keeps-window" else _selected(g)
    if f == "bitwise_not":
        bindings["X"] = (bindings["X"] * 10).long()
    return bindings | {"f": f}


@instance("scalar-keeps-selection", "int-scalar-keeps-selection")
def _(g: Gen) -> dict[str, Any]:
    f = g.pick(_FLOAT_BINARY + ["r" + name for name in _FLOAT_BINARY if name != "rsub"])
    c = g.int(1, 3) if g.rule.startswith("int") else str(g.pick((0.5, -1.25, 2.0)))
    return _selected(g) | {"f": f, "c": c}


def _operands(g: Gen, broadcast: str) -> dict[str, Any]:
    """A selected operand A and a second operand B of the same shape, broadcast along d, or of lower rank."""
    bindings = _selected(g)
    X, d = bindings.pop("X"), bindings["d"]
    shape = list(X.shape)
    if broadcast == "unit":
        shape[d] = 1
    elif broadcast == "lower":  # only the dims right of d (a bias over the last dims, or a scalar)
        shape = shape[d + 1 :] if d < -1 else []
    other = g.tensor(*shape)
    return bindings | {"A": X, "B": other, "f": g.pick(_FLOAT_BINARY)}


def _swap(bindings: dict[str, Any]) -> dict[str, Any]:
    return bindings | {"A": bindings["B"], "B": bindings["A"]}


@instance("binary-both-selected")
def _(g: Gen) -> dict[str, Any]:
    return _operands(g, "same")


@instance("binary-left-selected-right-broadcast")
def _(g: Gen) -> dict[str, Any]:
    return _operands(g, "unit")


@instance("binary-right-selected-left-broadcast")
def _(g: Gen) -> dict[str, Any]:
    return _swap(_operands(g, "unit"))


@instance("binary-left-selected-right-lower-rank")
def _(g: Gen) -> dict[str, Any]:
    return _operands(g, "lower")


@instance("binary-right-selected-left-lower-rank")
def _(g: Gen) -> dict[str, Any]:
    return _swap(_operands(g, "lower"))


def _unbroadcast_operand(g: Gen) -> dict[str, Any]:
    """B has the full dim where A is selected: the rank's selection would meet the wrong B entries."""
    bindings = _operands(g, "same")
    bindings["R"] = _scrambled_whole(g, bindings["A"].shape[bindings["d"]])
    bindings["f"] = g.pick(("add", "mul", "sub"))
    return bindings


@near_miss("binary-left-selected-right-broadcast", "binary-left-selected-right-lower-rank")
def _(g: Gen) -> dict[str, Any]:
    return _unbroadcast_operand(g)


@near_miss("binary-right-selected-left-broadcast", "binary-right-selected-left-lower-rank")
def _(g: Gen) -> dict[str, Any]:
    return _swap(_unbroadcast_operand(g))


@instance("fill-selected-mask-broadcast")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    shape = list(bindings["X"].shape)
    shape[bindings["d"]] = 1
    return bindings | {"M": g.mask(*shape), "v": g.pick(("0.0", "-inf", "1.5"))}


@instance("fill-selected-mask-lower-rank")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    while bindings["d"] == -1:  # the mask needs a dim after d
        bindings = _selected(g)
    kept = g.int(1, -bindings["d"] - 1)  # the mask has only (some of) the dims after d
    shape = list(bindings["X"].shape)[-kept:]
    return bindings | {"M": g.mask(*shape), "v": g.pick(("0.0", "-inf", "1.5"))}


@near_miss("fill-selected-mask-broadcast", "fill-selected-mask-lower-rank")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    bindings["R"] = _scrambled_whole(g, bindings["X"].shape[bindings["d"]])
    return bindings | {"M": g.mask(*bindings["X"].shape), "v": "0.0"}


@instance("fill-both-selected")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    return bindings | {"M": g.mask(*bindings["X"].shape), "v": g.pick(("0.0", "-inf"))}


@instance("where-all-selected")
def _(g: Gen) -> dict[str, Any]:
    bindings = _selected(g)
    shape = bindings["X"].shape
    return {"C": g.mask(*shape), "A": bindings["X"], "B": g.tensor(*shape), "d": bindings["d"], "R": bindings["R"]}


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


# ---------------------------------------------------------------------------------------------
# contractions
# ---------------------------------------------------------------------------------------------
def _linear(g: Gen, features: int | None = None, outputs: int | None = None) -> dict[str, Any]:
    k = features or g.int(4, 8)
    n = outputs or g.int(3, 8)
    return {"X": g.tensor(g.int(1, 2), g.int(2, 3), k), "W": g.tensor(n, k)}


@instance("column-parallel-linear")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    return bindings | {"R": g.selection(bindings["W"].shape[0])}


@instance("row-parallel-linear")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    s, e = g.tile(bindings["X"].shape[-1])
    return bindings | {"s": s, "e": e}


@instance("linear-leading-dim")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    d = g.pick((-2, -3))
    return bindings | {"d": d, "R": g.selection(bindings["X"].shape[d])}


@near_miss("linear-leading-dim")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(3, 6)
    bindings = _linear(g, k, k)
    return bindings | {"d": -1, "R": _scrambled_whole(g, k)}


def _matmul(g: Gen, m: int | None = None, k: int | None = None) -> dict[str, Any]:
    batch = [g.int(2, 3), g.int(2, 4)]
    m, k, n = m or g.int(2, 5), k or g.int(3, 6), g.int(2, 5)
    return {"A": g.tensor(*batch, m, k), "B": g.tensor(*batch, k, n)}


@instance("matmul-batch")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g)
    d = g.pick((-3, -4))
    return bindings | {"d": d, "R": g.selection(bindings["A"].shape[d])}


@near_miss("matmul-batch")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(3, 5)
    return _matmul(g, k, k) | {"d": -2, "R": _scrambled_whole(g, k)}


@instance("matmul-rows")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g)
    return bindings | {"R": g.selection(bindings["A"].shape[-2])}


def _broadcast_matmul(g: Gen, side: str, near: bool) -> dict[str, Any]:
    """A [b1, b2, m, k] @ [k, n] (or [m, k] @ [b1, b2, k, n]), a batch dim of the 4-D operand
    selected; the near miss gives the other operand that dim too, and selects one index of it,
    which then broadcasts back to the whole dim."""
    batch = [g.int(2, 3), g.int(2, 4)]
    m, k, n = g.int(2, 5), g.int(3, 6), g.int(2, 5)
    d = g.pick((-3, -4))
    other_batch = batch if near else []
    if side == "A":
        bindings = {"A": g.tensor(*batch, m, k), "B": g.tensor(*other_batch, k, n)}
    else:
        bindings = {"A": g.tensor(*other_batch, m, k), "B": g.tensor(*batch, k, n)}
    size = batch[len(batch) + 2 + d]
    if near:
        start = g.int(0, size - 1)
        return bindings | {"d": d, "R": range_list([(start, start + 1)])}
    return bindings | {"d": d, "R": g.selection(size)}


instance_and_near_miss("matmul-batch-broadcast-left", lambda g, near: _broadcast_matmul(g, "A", near))
instance_and_near_miss("matmul-batch-broadcast-right", lambda g, near: _broadcast_matmul(g, "B", near))


@instance("matmul-columns")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g)
    return bindings | {"R": g.selection(bindings["B"].shape[-1])}


@instance("matmul-contraction")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g, k=g.int(4, 7))
    s, e = g.tile(bindings["A"].shape[-1])
    return bindings | {"s": s, "e": e}


def _attention(g: Gen, d: int) -> dict[str, Any]:
    shape = [g.int(1, 3), g.int(2, 5), g.int(3, 5), g.int(2, 4)]
    return {
        "Q": g.tensor(*shape),
        "K": g.tensor(*shape),
        "V": g.tensor(*shape),
        "at": _ATTRS % g.pick(("true", "false")),
        "d": d,
        "R": g.selection(shape[d]),
    }


@instance("attention-heads")
def _(g: Gen) -> dict[str, Any]:
    return _attention(g, g.pick((-3, -4)))


@near_miss("attention-heads")
def _(g: Gen) -> dict[str, Any]:
    bindings = _attention(g, -2)  # a selection of the sequence: each query then sees other keys
    return bindings | {"R": g.selection(bindings["Q"].shape[-2], most=1), "at": _ATTRS % "false"}


def _masked_attention(g: Gen, d: int, broadcast_everywhere: bool = False) -> dict[str, Any]:
    bindings = _attention(g, d)
    batch, _, seq, _ = bindings["Q"].shape
    mask_shape = (1, 1, 1, 1) if broadcast_everywhere else g.pick(((seq, seq), (1, 1, seq, seq), (batch, 1, seq, seq)))
    additive = g.tensor(*mask_shape)  # an additive float mask (a bias on the scores)
    return bindings | {"M": additive, "at": _ATTRS % "false"}


@instance("masked-attention-heads")
def _(g: Gen) -> dict[str, Any]:
    return _masked_attention(g, g.pick((-3, -4)))


@near_miss("masked-attention-heads")
def _(g: Gen) -> dict[str, Any]:
    # a selection of the sequence (under a mask that fits any length): each query then sees fewer keys
    bindings = _masked_attention(g, -2, broadcast_everywhere=True)
    return bindings | {"R": g.selection(bindings["Q"].shape[-2], most=1)}


def _grouped_attention(g: Gen, window: str, off_by_one: bool) -> dict[str, Any]:
    """Query heads [s, e) on a rank, served by a window of one KV head repeated m times (GQA)."""
    kv_heads, m = g.int(2, 3), g.int(2, 4)
    batch, seq, dim = g.int(1, 2), g.int(2, 4), g.int(2, 3)
    heads = kv_heads * m
    n = g.int(1, m)
    lo = g.int(0, kv_heads - 2) * m
    hi = lo + m - n
    s = hi + 1 if off_by_one else g.int(lo, hi)
    repeated = {key: g.tensor(batch, kv_heads, seq, dim).repeat_interleave(m, dim=-3) for key in ("K", "V")}
    other = "V" if window == "K" else "K"
    return {
        "Q": g.tensor(batch, heads, seq, dim),
        **repeated,
        "at": _ATTRS % "true",
        "d": -3,
        "s": s,
        "e": s + n,
        "lo": lo,
        "hi": hi,
        "n": n,
        other.lower(): repeated[other].narrow(-3, s, n),
    }


instance_and_near_miss("attention-key-window", lambda g, off_by_one: _grouped_attention(g, "K", off_by_one))


def _grouped_matmul(g: Gen, window: str, off_by_one: bool) -> dict[str, Any]:
    """Batch slices [s, e) of one operand (query heads on a rank) against a window of the other,
    one slice repeated m times (its KV head); a near miss starts the range past the window, in
    the next group, whose slices differ."""
    groups, m = g.int(2, 3), g.int(2, 4)
    batch, rows, inner, columns = g.int(1, 2), g.int(2, 4), g.int(2, 3), g.int(2, 4)
    n = g.int(1, m)
    lo = g.int(0, groups - 2) * m
    hi = lo + m - n
    s = hi + 1 if off_by_one else g.int(lo, hi)
    left, right = g.tensor(batch, groups * m, rows, inner), g.tensor(batch, groups * m, inner, columns)
    if window == "B":
        right = g.tensor(batch, groups, inner, columns).repeat_interleave(m, dim=-3)
    else:
        left = g.tensor(batch, groups, rows, inner).repeat_interleave(m, dim=-3)
    return {"A": left, "B": right, "d": -3, "s": s, "e": s + n, "lo": lo, "hi": hi, "n": n}


instance_and_near_miss("matmul-batch-window-right", lambda g, off_by_one: _grouped_matmul(g, "B", off_by_one))
instance_and_near_miss("matmul-batch-window-left", lambda g, off_by_one: _grouped_matmul(g, "A", off_by_one))


instance_and_near_miss("attention-value-window", lambda g, off_by_one: _grouped_attention(g, "V", off_by_one))


# ---------------------------------------------------------------------------------------------
# data-parallel gradients: a backward seed expanded to a batch block, accumulated micro-batches,
# the embedding gradient of a block of tokens
# ---------------------------------------------------------------------------------------------
def _broadcast_window(g: Gen, longer: bool) -> dict[str, Any]:
    """One value expanded along a broadcast dim to K and to n < K positions (a near miss: n > K)."""
    K, m = g.int(3, 6), g.int(2, 4)
    n = K + g.int(1, 2) if longer else g.int(1, K - 1)
    return {"X": g.tensor(1, m), "d": -2, "s1": g.text((K, m)), "s2": g.text((n, m))}


instance_and_near_miss("expand-broadcast-window", _broadcast_window)


def _window_and_selection(g: Gen, outside_window: bool) -> dict[str, Any]:
    """A window operand (every slice of one group equal) and an operand selected by one range
    (a near miss selects a range in the next group, where the slices differ)."""
    d = g.int(-3, -1)
    if outside_window:
        m = g.int(2, 4)
        shape = _shape(g, 3)
        shape[d] = 2
        X = g.tensor(*shape).repeat_interleave(m, dim=d)
        lo = hi = 0
        n, start = 1, m
    else:
        window = _window(g, d)
        X, lo, hi, n = window["X"], window["lo"], window["hi"], window["n"]
        start = g.int(lo, hi)
    return {
        "A": X,
        "B": g.tensor(*X.shape),
        "d": d,
        "lo": lo,
        "hi": hi,
        "n": n,
        "s": start,
        "e": start + n,
        "f": g.pick(("add", "sub", "mul")),
    }


def _selection_and_window(g: Gen, outside_window: bool) -> dict[str, Any]:
    bindings = _window_and_selection(g, outside_window)
    return bindings | {"A": bindings["B"], "B": bindings["A"]}


instance_and_near_miss("window-meets-selection-left", _window_and_selection)
instance_and_near_miss("window-meets-selection-right", _selection_and_window)


def _adjacent_partials(g: Gen, swapped: bool) -> dict[str, Any]:
    """This rank's tile [s, f) of K, as the contributions of [s, e) and [e, f)."""
    shape = tuple(_shape(g, 2))
    size = g.int(4, 8)
    measure = g.contributions(shape, size)
    start, end = g.tile(size)
    middle = g.int(start, end)
    first = measure.part(start, middle)
    second = measure.part(middle, end)
    a, b = (second, first) if swapped else (first, second)
    return {"X": g.total(measure), "a": a, "b": b, "s": start, "e": middle, "f": end, "K": size}


instance("partial-adjacent")(lambda g: _adjacent_partials(g, swapped=False))
instance("partial-adjacent-swapped")(lambda g: _adjacent_partials(g, swapped=True))


def _embedding_backward_rows(g: Gen, other_dim: bool) -> dict[str, Any]:
    """Output gradients and ids of all tokens, each rank a block of token rows (a near miss
    takes the output gradients' block of batch rows with the ids' block of positions)."""
    import json

    seq, vocab = g.int(4, 7), g.int(4, 8)
    batch = seq if other_dim else g.int(4, 6)
    ids = g.ids((batch, seq), vocab)
    d2 = -1 if other_dim else g.pick((-2, -1))
    start, end = g.tile(ids.shape[d2])
    return {
        "G": g.tensor(batch, seq, g.int(2, 4)),
        "I": ids,
        "p": json.dumps(["<tensor>", "<tensor>", vocab, -1, False]),
        "d": -3 if other_dim else d2 - 1,
        "d2": d2,
        "s": start,
        "e": end,
    }


instance_and_near_miss("embedding-backward-of-token-rows", _embedding_backward_rows)


def _permutation_scatter(g: Gen, near: bool) -> dict[str, Any]:
    """A vector sorted for its permutation, scattered into a base of its length (a near miss sorts
    a shorter vector: its indices leave the base's last element as it was)."""
    import json

    n = g.int(3, 7)
    m = n - 1 if near else n
    return {
        "B": g.tensor(n),
        "X": g.tensor(m),
        "V": g.tensor(m),
        "a": json.dumps([]),
    }


instance_and_near_miss("permutation-scatter-overwrites-base", _permutation_scatter)


@instance("regroup-term-into-right-sum", "regroup-term-into-left-sum")
def _(g: Gen) -> dict[str, Any]:
    """A reduction A tiled over the ranks (this rank's contribution a), and two terms of A's shape or
    broadcast to it."""
    t = _term_tiling(g)
    s, e = t["tiles"][g.rank]
    shape = tuple(t["A"].shape)
    return {
        "A": t["A"],
        "a": t["parts"][g.rank],
        "s": s,
        "e": e,
        "K": t["K"],
        "X": t["b"],
        "C": g.tensor(*shape[-1:]) if g.int(0, 1) else g.tensor(*shape),
    }


@instance("moved-piece-through-view")
def _(g: Gen) -> dict[str, Any]:
    y = g.tensor(*_shape(g, g.int(1, 3)))
    return {"y": y, "s": ",".join(str(n) for n in (y.numel(),))}


def _padded_local_lookup(g: Gen, near: bool) -> dict[str, Any]:
    """Ids of a vocabulary, a shard [s, e) of it and a table of more than e - s rows (a near miss:
    a shard longer than the table, every id looked up still inside the table)."""
    rows = g.int(3, 6)
    n = rows + g.int(1, 2) if near else g.int(1, rows - 1)
    s = g.int(0, 3)
    vocab = s + n + g.int(0, 3)
    ids = g.ids((g.int(2, 3), g.int(2, 4)), vocab)
    if near:
        ids = ids.clamp(max=s + rows - 1)
    return {"W": g.tensor(rows, g.int(2, 4)), "I": ids, "s": s, "e": s + n}


instance_and_near_miss("local-lookup-reads-its-rows", _padded_local_lookup)


def _concat_window_and_selection(g: Gen, outside_window: bool, window_first: bool) -> dict[str, Any]:
    """A window piece and a selected piece, concatenated along some dim (a near miss selects a
    range outside the window)."""
    bindings = _window_and_selection(g, outside_window)
    bindings.pop("f")
    bindings["d2"] = g.int(-3, -1)
    return bindings if window_first else bindings | {"A": bindings["B"], "B": bindings["A"]}


instance_and_near_miss(
    "window-meets-selection-in-concat-left", lambda g, near: _concat_window_and_selection(g, near, True)
)
instance_and_near_miss(
    "window-meets-selection-in-concat-right", lambda g, near: _concat_window_and_selection(g, near, False)
)


@instance("sum-over-concatenated-dim", "max-over-concatenated-dim", "min-over-concatenated-dim")
def _(g: Gen) -> dict[str, Any]:
    return _two_pieces(g) | {"k": g.int(0, 1)}


def _unit_dim_view(g: Gen, not_one: bool) -> dict[str, Any]:
    """A value viewed with one size-1 dim inserted, reduced over that dim (a near miss: `all` or
    `any`, which of one element is its truth value, not the element)."""
    x = g.tensor(*_shape(g, g.int(1, 3)))
    nd = x.dim() + 1
    d = g.int(-nd, -1)
    shape = list(x.shape)
    shape.insert(nd + d, 1)
    f = g.pick(("all", "any")) if not_one else g.pick(_members("unit-reduction"))
    return {"x": x, "s": ",".join(str(n) for n in shape), "d": d, "f": f}


instance_and_near_miss("reduce-inserted-unit-dim", _unit_dim_view)


def _unit_dim_kept(g: Gen, longer: bool) -> dict[str, Any]:
    """A value with a size-1 dim reduced keeping it (a near miss: the dim has two elements)."""
    shape = _shape(g, g.int(1, 3))
    d = g.int(-len(shape), -1)
    shape[d] = 2 if longer else 1
    return {"X": g.tensor(*shape), "d": d, "f": g.pick(_members("unit-reduction"))}


instance_and_near_miss("reduce-unit-dim-keepdim", _unit_dim_kept)


def _with_unit(shape: tuple[int, ...], d: int) -> str:
    """The shape text with a size-1 dim inserted at negative position d of the longer shape."""
    longer = list(shape)
    longer.insert(len(shape) + 1 + d, 1)
    return ",".join(str(n) for n in longer)


@instance("squeeze-undoes-unsqueeze")
def _(g: Gen) -> dict[str, Any]:
    x = g.tensor(*_shape(g, g.int(1, 3)))
    d = g.int(-(x.dim() + 1), -1)
    return {"x": x, "d": d, "sh0": _with_unit(tuple(x.shape), d), "sh": ",".join(str(n) for n in x.shape)}


@instance("local-ids-of-squeezed")
def _(g: Gen) -> dict[str, Any]:
    bindings = _logits_and_targets(g, tiled=True)
    ids = bindings["I"]
    d = g.int(-(ids.dim() + 1), -1)
    shape = tuple(ids.shape)
    return {
        "I0": ids,
        "d": d,
        "sh0": _with_unit(shape, d),
        "sh": ",".join(str(n) for n in shape),
        "s": bindings["s"],
        "e": bindings["e"],
    }


@instance("target-pick-is-partial-unsqueezed")
def _(g: Gen) -> dict[str, Any]:
    bindings = _logits_and_targets(g, tiled=True)
    rows = tuple(bindings["I"].shape)
    d = g.int(-(len(rows) + 1), -1)
    unsqueezed = _with_unit(rows, d)
    return {
        "Z": bindings["Z"],
        "I": bindings["I"],
        "d2": bindings["d"],
        "s": bindings["s"],
        "e": bindings["e"],
        "d": d,
        "sh": unsqueezed,
        "shI": unsqueezed,
    }


@instance("view-back-to-source")
def _(g: Gen) -> dict[str, Any]:
    x = g.tensor(2, 3, 4)
    return {"x": x, "s1": g.pick(("6,4", "2,12", "24", "4,3,2")), "s2": "2,3,4"}


@instance("regroup-selected-sum-right", "regroup-selected-sum-left")
def _(g: Gen) -> dict[str, Any]:
    """Two reference values X and C of one shape, both selected alike, and a term b broadcast along
    the selected dim (size 1 there, or only the dims right of it), as every rank holds it whole."""
    bindings = _selected(g)
    X, d = bindings.pop("X"), bindings["d"]
    shape = list(X.shape)
    shape[d] = 1
    if g.int(0, 1):
        shape = shape[d + 1 :] if d < -1 else []
    return bindings | {"X": X, "C": g.tensor(*X.shape), "b": g.tensor(*shape)}


@instance("vocab-inside-mask", "vocab-inside-mask-swapped", "arithmetic-local-ids")
def _(g: Gen) -> dict[str, Any]:
    bindings = _vocab(g)
    return {"I": bindings["I"], "s": bindings["s"], "e": bindings["e"]}


def _negated_inside(g: Gen, not_negation: bool) -> dict[str, Any]:
    """The inside mask of a vocabulary shard and an op on it (a near miss: `isfinite`, true everywhere)."""
    bindings = _vocab(g)
    f = "isfinite" if not_negation else g.pick(_members("negation"))
    return {"I": bindings["I"], "s": bindings["s"], "e": bindings["e"], "f": f}


instance_and_near_miss("not-inside-is-outside", _negated_inside)
instance_and_near_miss("arithmetic-local-ids-filled", _negated_inside)


@instance("negation-of-viewed-mask")
def _(g: Gen) -> dict[str, Any]:
    bindings = _negated_inside(g, False)
    return bindings | {"sh": g.text((*bindings["I"].shape, 1))}


@instance("regroup-partials-out-of-residual", "regroup-partials-out-of-residual-with-term")
def _(g: Gen) -> dict[str, Any]:
    """Two reductions A and L with this rank's contributions, a residual X and a term b."""
    bindings = _two_partials(g, proportional=True)
    A = bindings.pop("A")
    return bindings | {
        "A": A,
        "a": bindings.pop("a"),
        "L": bindings.pop("B"),
        "l": bindings.pop("b"),
        "X": g.tensor(*A.shape),
        "b": g.tensor(*A.shape),
    }


# Instances of other concerns live in their own modules; importing registers them (and gives the
# recipes above the helpers they share with the reductions' instances).
from . import (  # noqa: E402, F401
    convolution_instances,
    elementwise_instances,
    index_set_instances,
    permutation_instances,
    scalar_instances,
    slice_instances,
)
from .reduction_instances import _logits_and_targets, _term_tiling, _two_partials, _vocab  # noqa: E402
