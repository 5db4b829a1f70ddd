"""Instances of the layout rules: views, reshapes, transposes and expansions that keep a selection
or a window of a dim (see instances.py for what an instance and a near miss are)."""

from __future__ import annotations

from typing import Any

from .generation import Gen
from .instances import _pairs, _selected, _shape, _two_or_more, instance, instance_and_near_miss, near_miss
from .meaning import indices, range_list


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
