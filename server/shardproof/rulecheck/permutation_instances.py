"""Instances of the permutation rules (verify/rules_permutations.py): the shape of a permuted value,
permutations of permutations, and elementwise ops with an operand the permutation leaves alone."""

from __future__ import annotations

from typing import Any

from .harness import Gen
from .instances import _FLOAT_BINARY, _shape, instance, instance_and_near_miss

_ARITHMETIC = ("add", "sub", "mul", "div", "maximum", "rsub")


def _permutation(g: Gen, nd: int, kept: int = 0) -> list[int]:
    """A random permutation of nd dims that leaves (at least) its last `kept` dims in place."""
    moved = list(range(nd - kept))
    g.random.shuffle(moved)
    return moved + list(range(nd - kept, nd))


@instance("shape-permute-dim", "shape-permute-rank")
def _(g: Gen) -> dict[str, Any]:
    nd = g.int(2, 4)
    return {"x": g.tensor(*_shape(g, nd)), "p": g.text(_permutation(g, nd)), "di": g.int(-nd, -1)}


@instance("permute-of-permute")
def _(g: Gen) -> dict[str, Any]:
    nd = g.int(3, 4)
    first = _permutation(g, nd)
    then = _permutation(g, nd)
    while [first[i] for i in then] == list(range(nd)):  # the composition is a permutation, not x
        then = _permutation(g, nd)
    return {"X": g.tensor(*_shape(g, nd)), "p": g.text(first), "q": g.text(then)}


@instance("permute-of-inverse")
def _(g: Gen) -> dict[str, Any]:
    nd = g.int(2, 4)
    first = _permutation(g, nd)
    return {"X": g.tensor(*_shape(g, nd)), "p": g.text(first), "q": g.text([first.index(o) for o in range(nd)])}


def _broadcast_operand(g: Gen, near: bool) -> dict[str, Any]:
    """X of 4 dims permuted by p, b broadcast along its last m dims, and a selection along a dim b
    does not have. The near miss's b has more dims than p leaves in place (sizes all equal, so
    both sides still broadcast): the op then reads b along a dim p moves."""
    nd = 4
    kept = g.int(1, 2)
    if near:
        n = g.int(2, 4)
        shape = [n] * nd
        perm = _permutation(g, nd, kept)
        while perm[nd - 1 - kept] == nd - 1 - kept:  # p keeps exactly `kept` dims
            perm = _permutation(g, nd, kept)
        m = kept + 1
    else:
        shape = _shape(g, nd)
        perm = _permutation(g, nd, kept)
        m = g.int(1, kept)
    b_shape = [1 if g.int(0, 3) == 0 else size for size in shape[nd - m :]]
    d = g.int(-nd, -(m + 1))
    return {
        "X": g.tensor(*shape),
        "p": g.text(perm),
        "b": g.tensor(*b_shape),
        "f": g.pick(_ARITHMETIC if near else _FLOAT_BINARY),
        "d": d,
        "R": g.selection(shape[perm[nd + d]]),
    }


for _side in ("right", "left"):
    instance_and_near_miss(f"permute-then-broadcast-operand-{_side}", _broadcast_operand)
    instance_and_near_miss(f"selection-of-permute-then-broadcast-operand-{_side}", _broadcast_operand)


@instance("permute-of-selection")
def _(g: Gen) -> dict[str, Any]:
    """A permuted value (X0 permuted by q), a rank's selection of it along di, permuted again by p."""
    q, p = _permutation(g, 4), _permutation(g, 4)
    shape = _shape(g, 4)
    X0 = g.tensor(*shape)
    X = X0.permute(q)
    di = g.int(-4, -1)
    return {"X0": X0, "q": g.text(q), "X": X, "R": g.selection(X.shape[di]), "p": g.text(p), "di": di}
