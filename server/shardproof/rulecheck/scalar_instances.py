"""Instances of the scaling rules (verify/rules_scalars.py): a scaled operand of a matrix product,
a linear map or a permutation, and two scalings as one."""

from __future__ import annotations

import math
from typing import Any

from ..verify import scalars
from .generation import Gen, RecipeError
from .instances import _shape, instance, near_miss

_SCALINGS = ("mul", "div", "rmul")
_NOT_SCALINGS = ("add", "sub")  # near misses: adding a constant is not linear


def _factor(g: Gen, integer: bool) -> Any:
    """A constant as the term writes it: an i64 for ScI, the text of a float for Sc."""
    if integer:
        return g.pick((2, 3, 4, 5, 7, 8))
    return scalars.factor_text(g.pick((-1.0, 1.0)) * g.random.uniform(0.1, 3.0))


for _term in ("Sc", "ScI"):
    _integer = _term == "ScI"
    _kind = "integer" if _integer else "float"

    for _near in (False, True):
        _register = near_miss if _near else instance
        _ops = _NOT_SCALINGS if _near else _SCALINGS

        @_register(f"scaled-left-operand-of-matmul-{_kind}", f"scaled-right-operand-of-matmul-{_kind}")
        def _(g: Gen, integer: bool = _integer, ops: tuple[str, ...] = _ops) -> dict[str, Any]:
            batch = [g.int(1, 3)] if g.int(0, 1) else []
            m, k, n = g.int(2, 5), g.int(2, 5), g.int(2, 5)
            a, b = g.tensor(*batch, m, k), g.tensor(*batch, k, n)
            return {"A": a, "B": b, "f": g.pick(ops), "c": _factor(g, integer)}

        @_register(f"scaled-negation-is-negated-scaling-{_kind}")
        def _(g: Gen, integer: bool = _integer, ops: tuple[str, ...] = _ops) -> dict[str, Any]:
            return {"z": g.tensor(*_shape(g, g.int(1, 3))), "f": g.pick(ops), "c": _factor(g, integer)}

        @_register(f"product-with-scaled-factor-{_kind}", f"product-with-scaled-second-factor-{_kind}")
        def _(g: Gen, integer: bool = _integer, ops: tuple[str, ...] = _ops) -> dict[str, Any]:
            shape = _shape(g, g.int(1, 3))
            small = g.pick([shape, shape[-1:], [*shape[:-1], 1]])
            a, b = g.tensor(*shape), g.tensor(*small)
            a, b = (a, b) if g.int(0, 1) else (b, a)
            return {"a": a, "b": b, "f": g.pick(ops), "c": _factor(g, integer)}

        @_register(f"scaled-input-of-linear-{_kind}", f"scaled-weight-of-linear-{_kind}")
        def _(g: Gen, integer: bool = _integer, ops: tuple[str, ...] = _ops) -> dict[str, Any]:
            k = g.int(2, 5)
            x = g.tensor(*_shape(g, g.int(1, 3)), k)
            return {"X": x, "W": g.tensor(g.int(2, 5), k), "f": g.pick(ops), "c": _factor(g, integer)}

    @instance(f"shape-of-scaled-{_kind}", f"rank-of-scaled-{_kind}")
    def _(g: Gen, integer: bool = _integer) -> dict[str, Any]:
        nd = g.int(1, 3)
        return {"x": g.tensor(*_shape(g, nd)), "f": g.pick(_SCALINGS), "c": _factor(g, integer), "d": g.int(-nd, -1)}


for _term in ("Sc", "ScI"):

    @instance(f"permute-of-scaled-{'integer' if _term == 'ScI' else 'float'}")
    def _(g: Gen, integer: bool = _term == "ScI") -> dict[str, Any]:
        nd = g.int(2, 4)
        perm = list(range(nd))
        while perm == sorted(perm):  # a permutation that moves something
            g.random.shuffle(perm)
        ops = _SCALINGS + _NOT_SCALINGS
        return {"A": g.tensor(*_shape(g, nd)), "p": g.text(perm), "f": g.pick(ops), "c": _factor(g, integer)}


@instance("scaling-of-scaling")
def _(g: Gen) -> dict[str, Any]:
    for _ in range(20):
        a = g.random.uniform(0.05, 3.0) * g.pick((-1.0, 1.0))
        b = g.random.uniform(0.05, 3.0)
        fact = scalars.product_fact(a, b)
        if (
            fact is not None
            and fact.startswith("(scprod ")
            and None
            not in (
                scalars.float_factor("mul", a),
                scalars.float_factor("mul", b),
            )
        ):
            product = fact.rsplit(" ", 1)[1].rstrip(")").strip('"')
            return {
                "X": g.tensor(*_shape(g, g.int(1, 3))),
                "a": scalars.factor_text(a),
                "b": scalars.factor_text(b),
                "c": product,
            }
    raise RecipeError("no two float factors whose product is a float factor")


@instance("scaling-of-scaling-reciprocal")
def _(g: Gen) -> dict[str, Any]:
    # a square root of 1/n on the queries and on the keys: d ** -0.25 each, 1/sqrt(d) in all
    for _ in range(20):
        n = g.int(2, 64)
        u = g.random.uniform(0.6, 1.7)
        a, b = u / math.sqrt(n), 1 / (u * math.sqrt(n))
        fact = scalars.product_fact(a, b)
        if (
            fact is not None
            and fact.startswith("(scprodrecip ")
            and None
            not in (
                scalars.float_factor("mul", a),
                scalars.float_factor("mul", b),
            )
        ):
            return {
                "X": g.tensor(*_shape(g, g.int(1, 3))),
                "a": scalars.factor_text(a),
                "b": scalars.factor_text(b),
                "n": int(fact.rsplit(" ", 1)[1].rstrip(")")),
            }
    raise RecipeError("no two float factors whose product is 1/n")


@instance("division-of-division", "multiple-of-multiple")
def _(g: Gen) -> dict[str, Any]:
    a, b = g.int(2, 9), g.int(2, 9)
    return {"X": g.tensor(*_shape(g, g.int(1, 3))), "a": a, "b": b, "c": a * b}


@instance("scaling-by-one")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, g.int(1, 3))), "f": g.pick(_SCALINGS)}


@near_miss("scaling-by-one")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, g.int(1, 3))), "f": g.pick(_NOT_SCALINGS)}  # X + 1, X - 1 are not X


@instance("square-is-product")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, g.int(1, 3)))}


@instance("division-undoes-multiple", "multiple-undoes-division")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, g.int(1, 3))), "a": g.pick((-3, -2, 2, 3, 5, 8))}


@near_miss("division-undoes-multiple", "multiple-undoes-division")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, g.int(1, 3))), "a": 0}  # (X * 0) / 0 and (X / 0) * 0 are not X


for _kind in ("float", "integer"):

    @instance(f"not-of-equal-is-not-equal-{_kind}", f"not-of-not-equal-is-equal-{_kind}")
    def _(g: Gen, integer: bool = _kind == "integer") -> dict[str, Any]:
        """Values some of which equal the constant (class ids and an ignore index; floats)."""
        if integer:
            c = g.pick((-100, 0, 3))
            x = g.ids((3, 4), 5)
            x[0, 0] = c
            return {"x": x, "c": c}
        c = g.pick((-1.0, 0.5, 2.0))
        x = g.tensor(3, 4)
        x[0, 1] = c
        x[1, 2] = float("nan")
        return {"x": x, "c": scalars.factor_text(c)}
