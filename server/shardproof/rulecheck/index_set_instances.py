"""Instances of the index-set rules (verify/index_sets.py): shards that are lists of ranges, such as
every k-th row, and the contributions of such sets to a reduction."""

from __future__ import annotations

import math
from typing import Any

from .generation import Gen
from .instances import _members, _shape, instance, instance_and_near_miss, near_miss
from .meaning import MultiSet, indices, range_list


def _runs(selected: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive indices, as ranges, in order."""
    runs: list[tuple[int, int]] = []
    for i in selected:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _ascending(g: Gen, n: int, count: int | None = None) -> tuple:
    """Some disjoint, non-empty, non-adjacent ranges of [0, n), in ascending order."""
    count = count or g.int(1, max(1, n // 3))
    edges = sorted(g.random.sample(range(n + 1), 2 * count))
    return range_list([(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i] < edges[i + 1]])


def _index_sets(g: Gen, size: int) -> list[tuple]:
    """A partition of [0, size) over the world into index sets of two ranges or more each: every
    world-th index from the rank's own offset (a round-robin shard), split in two on a world of one."""
    if g.world == 1:
        cut = g.int(1, size - 1)
        return [range_list([(0, cut), (cut, size)])]
    return [range_list([(i, i + 1) for i in range(r, size, g.world)]) for r in range(g.world)]


def _several(R: tuple) -> dict[str, Any]:
    """The pattern variables of a list of two ranges or more, (RCons s1 e1 (RCons s2 e2 t))."""
    _, s1, e1, (_, s2, e2, t) = R
    return {"R": R, "s1": s1, "e1": e1, "s2": s2, "e2": e2, "t": t}


def _round_robin_size(g: Gen) -> int:
    return g.world * g.int(2, 3) + (g.int(0, g.world - 1) if g.world > 1 else g.int(2, 4))


def _index_partial(g: Gen, shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """A value X split into K contributions, and this rank's contribution x of its index set R."""
    shape = shape or tuple(_shape(g, 3))
    size = _round_robin_size(g)
    measure = g.contributions(shape, size)
    R = _index_sets(g, size)[g.rank]
    return {"X": g.total(measure), "x": measure.part_of(indices(R)), "R": R, "K": size}


# -- range lists ------------------------------------------------------------------------------------
instance("range-tile-none")(lambda g: {"r": g.selection(g.int(2, 8)), "h": g.int(1, 8)})
instance_and_near_miss(
    "range-tile-more",
    lambda g, near: {"r": g.selection(g.int(2, 8)), "h": g.int(1, 8), "m": 0 if near else g.int(1, 4)},
)
instance("range-union-left-empty", "range-union-right-empty")(lambda g: {"r": _ascending(g, g.int(2, 12))})


def _two_ascending(g: Gen, left_first: bool) -> dict[str, Any]:
    """Two disjoint ascending lists whose first ranges come in the given order."""
    n = g.int(6, 16)
    whole = indices(_ascending(g, n, g.int(2, max(2, n // 3))))
    runs = _runs(whole)
    g.random.shuffle(runs)
    cut = g.int(1, len(runs) - 1)
    left, right = sorted(runs[:cut]), sorted(runs[cut:])
    if (left[0] < right[0]) != left_first:
        left, right = right, left
    (a, b), (c, d) = left[0], right[0]
    return {"a": a, "b": b, "t": range_list(left[1:]), "c": c, "d": d, "u": range_list(right[1:])}


instance_and_near_miss("range-union-left-first", lambda g, near: _two_ascending(g, left_first=not near))
instance_and_near_miss("range-union-right-first", lambda g, near: _two_ascending(g, left_first=near))
instance_and_near_miss(
    "range-ascending-last", lambda g, near: {"s": (s := g.int(0, 6)), "e": s if near else s + g.int(1, 4)}
)


@instance("range-ascending-cons")
def _(g: Gen) -> dict[str, Any]:
    t = _ascending(g, g.int(4, 12))
    s2 = t[1] + g.int(1, 3)
    t = range_list([(s2 + start - t[1], s2 + end - t[1]) for start, end in _runs(indices(t))])
    s = g.int(0, s2 - 1)
    return {"s": s, "e": g.int(s + 1, s2), "t": t, "s2": t[1], "e2": t[2], "t2": t[3]}


@near_miss("range-ascending-cons")
def _(g: Gen) -> dict[str, Any]:
    t = _ascending(g, g.int(4, 12))
    s2 = t[1] + 2
    t = range_list([(s2 + start - t[1], s2 + end - t[1]) for start, end in _runs(indices(t))])
    return {"s": g.int(0, s2 - 1), "e": s2 + 1, "t": t, "s2": t[1], "e2": t[2], "t2": t[3]}


def _tiled(g: Gen, near: bool, more: bool) -> dict[str, Any]:
    """m copies of [s, e) with period h, as a plain list (its first range, then the rest); a near
    miss makes the last copy one longer (not a copy)."""
    h = g.int(3, 6)
    s = g.int(0, h - 2)
    e = g.int(s + 1, h - 1)
    m = g.int(3, 4) if more else 2
    copies = [(s + i * h, e + i * h) for i in range(m)]
    if near:
        copies[-1] = (copies[-1][0], copies[-1][1] + 1)
    bound = {"r": range_list(copies), "s": s, "e": e}
    if not more:
        return bound | {"s2": copies[1][0], "e2": copies[1][1]}
    return bound | {"t": range_list(copies[1:]), "s2": copies[1][0], "e2": copies[1][1], "h": h, "m": m - 1}


instance_and_near_miss("range-tiled-two", lambda g, near: _tiled(g, near, more=False))


@instance("range-tiled-more")
def _(g: Gen) -> dict[str, Any]:
    return _tiled(g, False, more=True)


@near_miss("range-tiled-more")
def _(g: Gen) -> dict[str, Any]:
    # the first range one index closer to the copies than the period
    bound = _tiled(g, False, more=True)
    s, e = bound["s"] + 1, bound["e"] + 1
    return bound | {"r": ("RCons", s, e, bound["t"]), "s": s, "e": e}


# -- layout -----------------------------------------------------------------------------------------
def _merged_inner(g: Gen, outer_selected: bool) -> dict[str, Any]:
    """A value (m, h, c) and a selection of its inner dim h, both merged to (m * h, c) (a near miss
    selects the outer dim instead)."""
    m, h, c = g.int(2, 4), g.int(2, 4), g.int(2, 3)
    lead = [g.int(2, 3)] if g.int(0, 1) else []
    X = g.tensor(*lead, m, h, c)
    dim = -3 if outer_selected else -2
    R = g.selection(X.shape[dim])
    kept = len(indices(R))
    merged = (m * kept, c) if not outer_selected else (kept * h, c)
    return {
        "X": X,
        "R": R,
        "dj": dim,
        "di": -3,
        "do": -2,
        "h": h,
        "n": h if outer_selected else kept,
        "s1": g.text((*lead, m * h, c)),
        "s2": g.text((*lead, *merged)),
    }


instance_and_near_miss("view-merge-inner-selection", _merged_inner)


def _tiled_split(
    g: Gen,
    lead: list[int],
    m: int,
    c: int,
    run: tuple[int, int],
    inner: tuple[int, ...],
    local: tuple[int, ...],
) -> dict[str, Any]:
    """The bindings of a split of a (m * h, c) value into (m, *inner, c), h the product of `inner`,
    whose ranks hold the range `run` of every h-long run, split alike into (m, *local, c)."""
    s, e = run
    h = math.prod(inner)
    return {
        "X": g.tensor(*lead, m * h, c),
        "RT": range_list([(s + i * h, e + i * h) for i in range(m)]),
        "s": s,
        "e": e,
        "h": h,
        "m": m,
        "n": e - s,
        "di": -2,
        "do": -2 - len(inner),
        "s1": g.text((*lead, m, *inner, c)),
        "s2": g.text((*lead, m, *local, c)),
    }


def _split_tiled(g: Gen, near_miss: bool) -> dict[str, Any]:
    """A value (m * h, c) whose ranks select the range R of every h-long run, split to (m, h, c)
    (a near miss splits it into three dims, (m, h1, h2): R is not a selection of h1; or the ranks
    split theirs into other sizes than (m, |R|): two half-runs per run are no selection)."""
    m, c = g.int(2, 4), g.int(2, 3)
    lead = [g.int(2, 3)] if g.int(0, 1) else []
    if near_miss and g.int(0, 1):
        h = 2 * g.int(2, 3)
        s = g.int(0, h - 4)
        e = s + 4
        bindings = _tiled_split(g, lead, m, c, (s, e), (h,), (e - s,))
        return bindings | {"n": (e - s) // 2, "s2": g.text((*lead, 2 * m, (e - s) // 2, c))}
    if near_miss:
        s, e = 0, 4
        inner: tuple[int, ...] = (2, 4)
        local: tuple[int, ...] = (2, 2)
    else:
        h = g.int(2, 5)
        s = g.int(0, h - 1)
        e = g.int(s + 1, h)
        inner, local = (h,), (e - s,)
    return _tiled_split(g, lead, m, c, (s, e), inner, local)


instance_and_near_miss("view-split-tiled-selection", _split_tiled)


def _split_tiled_in_three(g: Gen, near_miss: bool) -> dict[str, Any]:
    """A value (m * h1 * h2, c) whose ranks select a whole number of h2-runs of every h-long run,
    split to (m, h1, h2, c) (a near miss selects runs that do not start at a multiple of h2, or
    splits the ranks' selection into (2m, |R| / 2h2, h2): other rows than the value's)."""
    m, h1, h2, c = g.int(2, 3), g.int(2, 4), g.int(2, 3), g.int(2, 3)
    lead = [g.int(2, 3)] if g.int(0, 1) else []
    if near_miss and g.int(0, 1):
        h1 = 4
        s, e = 0, 4 * h2
        bindings = _tiled_split(g, lead, m, c, (s, e), (h1, h2), (4, h2)) | {"h1": h1, "h2": h2}
        return bindings | {"n": 2 * h2, "s2": g.text((*lead, 2 * m, 2, h2, c))}
    unaligned = int(near_miss)
    a = g.int(0, h1 - 2) if unaligned else g.int(0, h1 - 1)
    b = g.int(a + 1, h1 - 1) if unaligned else g.int(a + 1, h1)
    s, e = a * h2 + unaligned, b * h2 + unaligned  # (a near miss: one past the runs' starts)
    return _tiled_split(g, lead, m, c, (s, e), (h1, h2), ((e - s) // h2, h2)) | {"h1": h1, "h2": h2}


instance_and_near_miss("view-split-tiled-selection-in-three", _split_tiled_in_three)


# -- contractions over index sets -------------------------------------------------------------------
@instance("row-parallel-linear-over-index-set")
def _(g: Gen) -> dict[str, Any]:
    size = _round_robin_size(g)
    return {
        "X": g.tensor(g.int(1, 2), g.int(2, 3), size),
        "W": g.tensor(g.int(2, 5), size),
    } | _several(_index_sets(g, size)[g.rank])


@instance("matmul-contraction-over-index-set")
def _(g: Gen) -> dict[str, Any]:
    size = _round_robin_size(g)
    batch = [g.int(2, 3)]
    return {
        "A": g.tensor(*batch, g.int(2, 4), size),
        "B": g.tensor(*batch, size, g.int(2, 4)),
    } | _several(_index_sets(g, size)[g.rank])


@instance("sum-of-index-set-is-partial")
def _(g: Gen) -> dict[str, Any]:
    size = _round_robin_size(g)
    shape = _shape(g, 3)
    d = g.int(-3, -1)
    shape[d] = size
    return {"X": g.tensor(*shape), "d": d, "k": g.int(0, 1)} | _several(_index_sets(g, size)[g.rank])


instance_and_near_miss(
    "index-set-partial-unary-linear",
    lambda g, near: _index_partial(g) | {"f": g.pick(("exp", "relu") if near else _members("linear-unary"))},
)
instance_and_near_miss(
    "index-set-partial-scaled",
    lambda g, near: (
        _index_partial(g)
        | {"f": g.pick(("add", "sub") if near else _members("scaling")), "c": g.pick(("0.5", "-2.0", "3.25"))}
    ),
)
instance("index-set-partial-viewed")(
    lambda g: _index_partial(g, shape=(2, 3, 4)) | {"s1": g.pick(("6,4", "2,12", "24", "4,3,2"))}
)


@instance("index-set-partial-permuted")
def _(g: Gen) -> dict[str, Any]:
    perm = [0, 1, 2]
    g.random.shuffle(perm)
    return _index_partial(g) | {"p": g.text(perm)}


# -- covers -----------------------------------------------------------------------------------------
def _partition(g: Gen) -> dict[str, Any]:
    size = _round_robin_size(g)
    measure = g.contributions(tuple(_shape(g, 2)), size)
    sets = _index_sets(g, size)
    return {"Z": g.total(measure), "sets": sets, "parts": [measure.part_of(indices(R)) for R in sets], "K": size}


@instance("index-set-cover-start")
def _(g: Gen) -> dict[str, Any] | None:
    if g.rank:
        return None  # only the set holding index 0 starts a cover
    t = _partition(g)
    R = t["sets"][0]
    return {"Z": t["Z"], "p": t["parts"][0], "R": R, "e": R[2], "t": R[3], "K": t["K"]}


def _merged(sets: list[tuple]) -> tuple:
    return range_list(_runs(sorted(i for R in sets for i in indices(R))))


@instance("index-set-cover-extend")
def _(g: Gen) -> dict[str, Any] | None:
    if g.rank == 0:
        return None  # the set holding index 0 starts a cover; it does not extend one
    t = _partition(g)
    U, V = _merged(t["sets"][: g.rank]), t["sets"][g.rank]
    return {
        "Z": t["Z"],
        "ms": MultiSet(t["parts"][: g.rank]),
        "U": U,
        "g": U[2],
        "t": U[3],
        "p": t["parts"][g.rank],
        "V": V,
        "h": V[2],
        "t2": V[3],
        "K": t["K"],
    }


@instance("index-set-cover-evaluated")
def _(g: Gen) -> dict[str, Any]:
    t = _partition(g)
    return {"Z": t["Z"], "ms": MultiSet(t["parts"][: g.rank + 1]), "U": _merged(t["sets"][: g.rank + 1]), "K": t["K"]}


@instance("all-reduce-of-index-set-partition")
def _(g: Gen) -> dict[str, Any]:
    t = _partition(g)
    return {"Z": t["Z"], "ms": MultiSet(t["parts"]), "K": t["K"]}
