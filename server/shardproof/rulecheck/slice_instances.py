"""Instances of the laws that move a slice out of an operation mapping its dim one to one (a
linear along a leading dim, elementwise ops with a broadcast operand) and of a slice across two
concatenated pieces (verify/rules.py, verify/rules_elementwise.py)."""

from __future__ import annotations

from typing import Any

from .contraction_instances import _linear
from .elementwise_instances import _FLOAT_BINARY, _unary
from .generation import Gen
from .instances import _shape, _two_pieces, instance, instance_and_near_miss, near_miss


@instance("linear-of-leading-slice")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    x, d = bindings.pop("X"), g.pick((-2, -3))
    a = g.int(0, x.shape[d] - 1)
    return {"x": x, "w": bindings["W"], "d": d, "a": a, "b": g.int(a + 1, x.shape[d])}


@near_miss("linear-of-leading-slice")
def _(g: Gen) -> dict[str, Any]:
    # the slice of the features (d = -1), whole, with more outputs than features: x @ w^T keeps
    # every output, (x @ w^T)[..., 0:k] only the first k
    k = g.int(3, 5)
    bindings = _linear(g, k, k + 2)
    return {"x": bindings["X"], "w": bindings["W"], "d": -1, "a": 0, "b": k}


@instance("slice-of-concat-across")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    na, nb = bindings["a"].shape[bindings["d"]], bindings["b"].shape[bindings["d"]]
    return bindings | {"s": g.int(0, na - 1), "e": g.int(na + 1, na + nb)}


@near_miss("slice-of-concat-across")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_pieces(g)
    na, nb = bindings["a"].shape[bindings["d"]], bindings["b"].shape[bindings["d"]]
    return bindings | {"s": na + 1, "e": na + nb}  # inside the second piece: no part in the first


def _sliced(g: Gen, rank: int = 3) -> dict[str, Any]:
    """x of `rank` dims and a slice [a, b) of its dim d."""
    x = g.tensor(*_shape(g, rank))
    d = g.int(-rank, -1)
    a = g.int(0, x.shape[d] - 1)
    return {"x": x, "d": d, "a": a, "b": g.int(a + 1, x.shape[d])}


@instance("unary-of-slice")
def _(g: Gen) -> dict[str, Any]:
    return _sliced(g, g.int(1, 3)) | {"f": _unary(g)}


@instance("scalar-of-slice")
def _(g: Gen) -> dict[str, Any]:
    f = g.pick(_FLOAT_BINARY + ["r" + name for name in _FLOAT_BINARY if name != "rsub"])
    return _sliced(g) | {"f": f, "c": str(g.pick((0.5, -1.25, 2.0)))}


def _broadcast_operand(g: Gen, near: bool) -> dict[str, Any]:
    """A slice of x along d and c over the dims right of d only (a bias: it broadcasts along d); the
    near miss gives c dim d too, of the size of x's, where the slice is one wide (so the op still
    broadcasts, the slice against c: f(x[a:a+1], c) has all of d's rows, f(x, c)[a:a+1] one)."""
    bindings = _sliced(g)
    x, d = bindings["x"], bindings["d"]
    if not near:
        return bindings | {"c": g.tensor(*x.shape[d + 1 :]) if d < -1 else g.tensor(), "f": g.pick(_FLOAT_BINARY)}
    d = g.int(-3, -2)
    x = g.tensor(*[max(n, 2) for n in x.shape])
    a = g.int(0, x.shape[d] - 1)
    return {"x": x, "d": d, "a": a, "b": a + 1, "c": g.tensor(*x.shape[d:]), "f": g.pick(("add", "mul", "sub"))}


instance_and_near_miss("binary-of-slice-and-broadcast", _broadcast_operand)
instance_and_near_miss("binary-of-broadcast-and-slice", _broadcast_operand)


def _binary_sliced(g: Gen, near: bool) -> dict[str, Any]:
    """A slice along d of f(x, y), y over x's dims from d on (a bias, or a value of x's shape);
    the near miss gives y one row along d (it broadcasts), sliced past that row."""
    bindings = _sliced(g)
    x, d = bindings["x"], bindings["d"]
    f = g.pick(_FLOAT_BINARY)
    if not near:
        trailing = x.shape[d:] if g.pick((True, False)) else x.shape
        return bindings | {"y": g.tensor(*trailing), "f": f}
    x = g.tensor(*[max(n, 3) for n in x.shape])
    a = g.int(1, x.shape[d] - 1)
    y = g.tensor(1, *x.shape[d + 1 :]) if d < -1 else g.tensor(1)
    return {"x": x, "d": d, "a": a, "b": x.shape[d], "y": y, "f": f}


instance_and_near_miss("slice-of-binary", _binary_sliced)
