"""Instances of the elementwise rules that move an op across a view (verify/rules.py)."""

from __future__ import annotations

from typing import Any

from ..capture.lowering_tables import _UNARY
from .harness import Gen
from .instances import _FLOAT_BINARY, _members, _selected, _shape, instance, near_miss


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


@instance("regroup-selected-product")
def _(g: Gen) -> dict[str, Any]:
    """Two reference values X and G of one shape, both selected alike, and a factor r broadcast along
    the selected dim (size 1 there: a per-row normaliser every rank holds whole)."""
    bindings = _selected(g)
    X, d = bindings.pop("X"), bindings["d"]
    shape = list(X.shape)
    shape[d] = 1
    return bindings | {"X": X, "G": g.tensor(*X.shape), "r": g.tensor(*shape)}
