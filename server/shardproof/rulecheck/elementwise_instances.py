"""Instances of the elementwise rules: an op that keeps a selection or a window, and one that moves
across a view (verify/rules.py)."""

from __future__ import annotations

from typing import Any

from ..capture.lowering_tables import _BINARY, _UNARY
from .generation import Gen
from .instances import _members, _scrambled_whole, _selected, _shape, instance, near_miss
from .layout_instances import _window

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


def _unary(g: Gen) -> str:
    # (bitwise_not takes integers: the recipes here make floating tensors)
    return g.pick(
        [f for f in sorted(_UNARY) if f != "bitwise_not"] + [f"cast_{d}" for d in ("float32", "int64", "bool")]
    )


@instance("unary-of-view")
def _(g: Gen) -> dict[str, Any]:
    m = g.tensor(*_shape(g, g.int(1, 3)))
    flat = m.numel()
    shapes = [(flat,), (1, flat), (*m.shape, 1)] + ([(m.shape[0] * m.shape[1], *m.shape[2:])] if m.dim() > 1 else [])
    return {"m": m, "f": _unary(g), "sh": g.text(g.pick(shapes)), "s0": g.text(tuple(m.shape)), "k": m.dim()}


@instance("binary-of-views")
def _(g: Gen) -> dict[str, Any]:
    a = g.tensor(*_shape(g, g.int(1, 3)))
    flat = a.numel()
    shapes = [(flat,), (1, flat), (*a.shape, 1)] + ([(a.shape[0] * a.shape[1], *a.shape[2:])] if a.dim() > 1 else [])
    b = g.tensor(*a.shape).abs() + 0.5  # a divisor or an exponent's base away from zero
    return {
        "a": a,
        "b": b,
        "f": g.pick(_FLOAT_BINARY),
        "sh": g.text(g.pick(shapes)),
        "s0": g.text(tuple(a.shape)),
        "k": a.dim(),
    }


@instance("unary-keeps-sizes")
def _(g: Gen) -> dict[str, Any]:
    x = g.tensor(*_shape(g, g.int(1, 3)))
    return {"x": x, "f": _unary(g), "d": g.int(-x.dim(), -1)}


@instance("floating-cast-keeps-the-value")
def _(g: Gen) -> dict[str, Any]:
    return {"x": g.tensor(*_shape(g, g.int(1, 3))), "f": g.pick(_members("real-cast"))}


@near_miss("floating-cast-keeps-the-value")
def _(g: Gen) -> dict[str, Any]:
    # a cast to an integer type truncates (the recipe's values are not whole numbers)
    return {"x": g.tensor(*_shape(g, g.int(1, 3))) + 0.5, "f": g.pick(("cast_int64", "cast_int32", "cast_bool"))}


@instance("product-of-quotient")
def _(g: Gen) -> dict[str, Any]:
    """a, b and a divisor s of one shape, or b or s broadcast along the last dim (a per-row sum)."""
    shape = _shape(g, g.int(1, 3))
    row = [*shape[:-1], 1]
    return {"a": g.tensor(*shape), "b": g.tensor(*g.pick([shape, row])), "s": g.tensor(*g.pick([shape, row]))}


def _quotients(g: Gen, per_row: bool) -> dict[str, Any]:
    """x divided by s, summed along d keeping it: s of size 1 along d (one divisor per row), or
    (a near miss) a divisor per element."""
    shape = _shape(g, 3)
    d = g.int(-3, -1)
    shape[d] = g.int(2, 5)
    divisor = list(shape)
    if per_row:
        divisor[d] = 1
    return {"x": g.tensor(*shape), "s": g.tensor(*divisor).abs() + 0.5, "d": d}


instance("sum-of-quotients-by-one-divisor")(lambda g: _quotients(g, True))
near_miss("sum-of-quotients-by-one-divisor")(lambda g: _quotients(g, False))


def _product_sizes(g: Gen, shared: bool) -> dict[str, Any]:
    """a and b of one shape (or, a near miss, a of size 1 along d where b is not: the product has
    b's size there, not a's)."""
    shape = _shape(g, g.int(1, 3))
    d = g.int(-len(shape), -1)
    shape[d] = g.int(2, 4)
    a_shape = list(shape)
    if not shared:
        a_shape[d] = 1
    return {"a": g.tensor(*a_shape), "b": g.tensor(*shape), "s": g.tensor(*shape).abs() + 0.5, "d": d}


instance("product-of-quotient-sizes")(lambda g: _product_sizes(g, True))
near_miss("product-of-quotient-sizes")(lambda g: _product_sizes(g, False))


@instance("silu-is-x-times-sigmoid")
def _(g: Gen) -> dict[str, Any]:
    return {"x": g.tensor(*_shape(g, g.int(1, 3)))}


@instance("division-by-one-plus-exp-of-negation-is-sigmoid")
def _(g: Gen) -> dict[str, Any]:
    """a and g of one shape, or g broadcast (a per-row gate)."""
    shape = _shape(g, g.int(1, 3))
    g_shape = g.pick([shape, [*shape[:-1], 1]])
    return {"a": g.tensor(*shape), "g": g.tensor(*g_shape)}


@instance("reciprocal-of-one-plus-exp-of-negation-is-sigmoid")
def _(g: Gen) -> dict[str, Any]:
    return {"g": g.tensor(*_shape(g, g.int(1, 3)))}


@instance("subtracting-a-negation-is-adding", "adding-a-negation-is-subtracting", "reversed-difference-is-negated")
def _(g: Gen) -> dict[str, Any]:
    """a and b of one shape, or either broadcast to the other's."""
    shape = _shape(g, g.int(1, 3))
    small = g.pick([shape, shape[-1:], [*shape[:-1], 1]])
    a, b = g.tensor(*shape), g.tensor(*small)
    return {"a": a, "b": b} if g.int(0, 1) else {"a": b, "b": a}


@instance("square-is-self-product")
def _(g: Gen) -> dict[str, Any]:
    return {"x": g.tensor(*_shape(g, g.int(1, 3)))}


@instance("division-by-root-is-reciprocal-root")
def _(g: Gen) -> dict[str, Any]:
    """a and a positive v of one shape, or v broadcast (a norm's per-row mean of squares)."""
    shape = _shape(g, g.int(1, 3))
    v_shape = g.pick([shape, [*shape[:-1], 1]])
    return {"a": g.tensor(*shape), "v": g.tensor(*v_shape).abs() + 0.1}


@instance("regroup-sum-as-written-elsewhere")
def _(g: Gen) -> dict[str, Any]:
    """a and c of one shape, b broadcast to it (a bias) or of that shape too."""
    shape = _shape(g, g.int(1, 3))
    b_shape = g.pick([shape, shape[-1:], [1] * len(shape)])
    return {"a": g.tensor(*shape), "c": g.tensor(*shape), "b": g.tensor(*b_shape)}


@instance("expand-source-window")
def _(g: Gen) -> dict[str, Any]:
    """A value of size 1 along one dim, expanded along it only."""
    shape = _shape(g, g.int(2, 3))
    d = g.int(-len(shape), -1)
    shape[d] = 1
    out = list(shape)
    out[d] = g.int(2, 5)
    return {"X": g.tensor(*shape), "s": g.text(tuple(out))}


@instance("product-commutes")
def _(g: Gen) -> dict[str, Any]:
    """a and b of one shape, or b broadcast to a's (a weight along the last dims, a per-row factor)."""
    shape = _shape(g, g.int(1, 3))
    b_shape = g.pick([shape, shape[-1:], [*shape[:-1], 1]])
    a, b = g.tensor(*shape), g.tensor(*b_shape)
    return {"a": a, "b": b} if g.int(0, 1) else {"a": b, "b": a}


@instance("sum-commutes")
def _(g: Gen) -> dict[str, Any]:
    """a and b of one shape, or b broadcast to a's (a bias along the last dim, a per-row term)."""
    shape = _shape(g, g.int(1, 3))
    b_shape = g.pick([shape, shape[-1:], [*shape[:-1], 1]])
    a, b = g.tensor(*shape), g.tensor(*b_shape)
    return {"a": a, "b": b} if g.int(0, 1) else {"a": b, "b": a}


def _picked_rows(g: Gen, side: str) -> dict[str, Any]:
    """A value X of three dims picked along d by indices I (X's dims without d), both selected by
    R along another dim d2: left of d for `outer` (the indices' dim e = d2 + 1), right of it for
    `inner` (e = d2)."""
    shape = [g.int(3, 6) for _ in range(3)]
    pairs = [(d, d2) for d in (-3, -2, -1) for d2 in (-3, -2, -1) if (d2 < d if side == "outer" else d2 > d)]
    d, d2 = g.pick(pairs)
    index_shape = tuple(n for i, n in enumerate(shape) if i != len(shape) + d)
    bindings = {"X": g.tensor(*shape), "I": g.ids(index_shape, shape[d]), "d": d, "d2": d2}
    return bindings | {"R": g.selection(shape[d2]), "e": d2 + 1 if side == "outer" else d2}


@instance("pick-keeps-selection-outer")
def _(g: Gen) -> dict[str, Any]:
    return _picked_rows(g, "outer")


@instance("pick-keeps-selection-inner")
def _(g: Gen) -> dict[str, Any]:
    bindings = _picked_rows(g, "inner")
    del bindings["e"]
    return bindings


@near_miss("pick-keeps-selection-outer", "pick-keeps-selection-inner")
def _(g: Gen) -> dict[str, Any]:
    """Values picked along the last dim, selected along the one before, with the indices selected
    along their own dim -2 (the value's -3) instead of their -1: the whole dims reordered, so that
    both selections exist and the picks' shapes agree."""
    n = g.int(3, 6)
    R = _scrambled_whole(g, n)
    return {"X": g.tensor(n, n, n), "I": g.ids((n, n), n), "d": -1, "d2": -2, "R": R, "e": -2}


@instance("regroup-selected-product")
def _(g: Gen) -> dict[str, Any]:
    """Two reference values X and G of one shape, both selected alike, and a factor r broadcast along
    the selected dim (size 1 there: a per-row normaliser every rank holds whole)."""
    bindings = _selected(g)
    X, d = bindings.pop("X"), bindings["d"]
    shape = list(X.shape)
    shape[d] = 1
    return bindings | {"X": X, "G": g.tensor(*X.shape), "r": g.tensor(*shape)}
