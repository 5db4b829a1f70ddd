"""Instances of the permutation rules (verify/rules_permutations.py): the shape of a permuted value,
permutations of permutations, elementwise ops with an operand the permutation leaves alone, and the
operations a permutation moves out of (elementwise ops, a linear map, a softmax or a reduction
along dims it leaves in place)."""

from __future__ import annotations

from typing import Any

from .elementwise_instances import _FLOAT_BINARY, _unary
from .generation import Gen
from .instances import _shape, instance, instance_and_near_miss, near_miss

_ARITHMETIC = ("add", "sub", "mul", "div", "maximum", "rsub")


def _permutation(g: Gen, nd: int, kept: int = 0) -> list[int]:
    """A random permutation of nd dims that leaves (at least) its last `kept` dims in place."""
    moved = list(range(nd - kept))
    g.random.shuffle(moved)
    return moved + list(range(nd - kept, nd))


def _permutation_keeping_exactly(g: Gen, nd: int, kept: int) -> list[int]:
    """A random permutation of nd dims that leaves its last `kept` dims in place and moves the one
    before them (nd - kept >= 2)."""
    perm = _permutation(g, nd, kept)
    while perm[nd - 1 - kept] == nd - 1 - kept:
        perm = _permutation(g, nd, kept)
    return perm


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
        perm = _permutation_keeping_exactly(g, nd, kept)
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


# -- a computation on a permuted layout (Megatron's sequence first against a batch-first reference) --
def _permuted(g: Gen) -> dict[str, Any]:
    """x of 2 to 4 dims and any permutation of them."""
    nd = g.int(2, 4)
    return {"x": g.tensor(*_shape(g, nd)), "p": g.text(_permutation(g, nd))}


@instance("unary-of-permute")
def _(g: Gen) -> dict[str, Any]:
    return _permuted(g) | {"f": _unary(g)}


@instance("scalar-of-permute-float")
def _(g: Gen) -> dict[str, Any]:
    f = g.pick(_FLOAT_BINARY + ["r" + name for name in _FLOAT_BINARY if name != "rsub"])
    return _permuted(g) | {"f": f, "c": str(g.pick((0.5, -1.25, 2.0)))}


@instance("scalar-of-permute-integer")
def _(g: Gen) -> dict[str, Any]:
    return _permuted(g) | {"f": g.pick(("add", "sub", "mul", "div", "pow")), "c": g.int(1, 4)}


@instance("binary-of-permutes")
def _(g: Gen) -> dict[str, Any]:
    bindings = _permuted(g)
    shape = list(bindings["x"].shape)
    broadcast = [1 if g.int(0, 2) == 0 else n for n in shape]  # z broadcasts along some of x's dims
    return bindings | {"z": g.tensor(*broadcast), "f": g.pick(_FLOAT_BINARY)}


def _trailing_operand(g: Gen, near: bool) -> dict[str, Any]:
    """As `_broadcast_operand` (X permuted by p, b over at most the dims p keeps; the near miss's b
    one dim longer), without the selection."""
    bindings = _broadcast_operand(g, near)
    return {name: bindings[name] for name in ("X", "p", "b", "f")}


for _side in ("right", "left"):
    instance_and_near_miss(f"permute-then-broadcast-operand-{_side}", _trailing_operand)


@instance("linear-of-permute")
def _(g: Gen) -> dict[str, Any]:
    features = g.int(3, 6)
    nd = g.int(2, 4)
    x = g.tensor(*_shape(g, nd - 1), features)
    return {"x": x, "w": g.tensor(g.int(2, 5), features), "p": g.text(_permutation(g, nd, 1))}


@near_miss("linear-of-permute")
def _(g: Gen) -> dict[str, Any]:
    # p moves the features: x.permute(p) multiplies the weight along another dim of x (square x,
    # so the shapes still fit)
    n = g.int(3, 5)
    x = g.tensor(n, n)
    return {"x": x, "w": g.tensor(g.int(2, 4), n), "p": g.text([1, 0])}


def _along_trailing(g: Gen, near: bool) -> dict[str, Any]:
    """x permuted by p keeping its last `kept` dims, and a dim d among them; the near miss's d is the
    first dim p moves (all sizes equal, so the shapes still fit)."""
    if near:
        nd, n = g.int(3, 4), g.int(2, 4)
        kept = g.int(1, nd - 2)  # two dims at least to move
        perm = _permutation_keeping_exactly(g, nd, kept)
        return {"x": g.tensor(*[n] * nd), "p": g.text(perm), "d": -(kept + 1)}
    nd = g.int(2, 4)
    kept = g.int(1, nd - 1)
    return {"x": g.tensor(*_shape(g, nd)), "p": g.text(_permutation(g, nd, kept)), "d": g.int(-kept, -1)}


instance_and_near_miss("softmax-of-permute", _along_trailing)


def _reduced_trailing(g: Gen, near: bool) -> dict[str, Any]:
    return _along_trailing(g, near) | {"f": g.pick(("sum", "mean", "amax", "amin", "logsumexp", "argmax"))}


instance_and_near_miss("reduction-of-permute", _reduced_trailing)


@instance("slice-of-permute")
def _(g: Gen) -> dict[str, Any]:
    nd = g.int(2, 4)
    x, perm = g.tensor(*_shape(g, nd)), _permutation(g, nd)
    do = g.int(-nd, -1)
    size = x.shape[perm[nd + do]]
    a = g.int(0, size - 1)
    return {"x": x, "p": g.text(perm), "do": do, "di": perm[nd + do] - nd, "a": a, "b": g.int(a + 1, size)}


@instance("concat-of-permutes")
def _(g: Gen) -> dict[str, Any]:
    nd = g.int(2, 4)
    perm = _permutation(g, nd)
    do = g.int(-nd, -1)
    di = perm[nd + do] - nd
    shape = _shape(g, nd)
    other = list(shape)
    other[nd + di] = g.int(1, 4)
    return {"a": g.tensor(*shape), "b": g.tensor(*other), "p": g.text(perm), "do": do, "di": di}
