"""Instances of the data-parallel gradient rules: a backward seed expanded to a batch block,
accumulated micro-batches, the embedding gradient of a block of tokens, the gradients of a
vocabulary-parallel loss (see instances.py for what an instance and a near miss are)."""

from __future__ import annotations

from typing import Any

from .generation import Gen
from .instances import _members, _selected, _shape, _two_pieces, instance, instance_and_near_miss
from .layout_instances import _window
from .reduction_instances import _logits_and_targets, _term_tiling, _two_partials, _vocab


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
