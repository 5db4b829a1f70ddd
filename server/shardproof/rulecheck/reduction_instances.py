"""Instances of the rules about values reduced over ranks (verify/rules_reductions.py): vocabulary-
parallel lookups, partial sums, shares and covers, vocabulary-parallel losses."""

from __future__ import annotations

from typing import Any

import torch

from .generation import Gen
from .instances import _members, _shape, instance, instance_and_near_miss, near_miss
from .meaning import MultiSet, outside


# ---------------------------------------------------------------------------------------------
# embedding
# ---------------------------------------------------------------------------------------------
def _vocab(g: Gen) -> dict[str, Any]:
    vocab, hidden = g.int(5, 12), g.int(2, 4)
    s, e = g.tile(vocab)
    return {"W": g.tensor(vocab, hidden), "I": g.ids((2, g.int(2, 4)), vocab), "s": s, "e": e}


@instance("embedding-columns")
def _(g: Gen) -> dict[str, Any]:
    bindings = _vocab(g)
    return bindings | {"R": g.selection(bindings["W"].shape[-1])}


@instance("embedding-rows-of-ids")
def _(g: Gen) -> dict[str, Any]:
    bindings = _vocab(g)
    d = g.pick((-1, -2))
    return bindings | {"d": d, "R": g.selection(bindings["I"].shape[d])}


@instance(*(f"{f}-of-shifted" for f in ("lt", "le", "gt", "ge", "eq", "ne")))
def _(g: Gen) -> dict[str, Any]:
    """Ids shifted by a rank's start, compared with a bound near them (some on each side)."""
    vocab = g.int(5, 12)
    return {"I": g.ids((2, g.int(2, 4)), vocab), "s": g.int(0, vocab - 1), "c": g.int(-3, 3)}


@instance("vocab-mask", "vocab-mask-swapped", "vocab-local-ids", "vocab-local-lookup")
def _(g: Gen) -> dict[str, Any]:
    return _vocab(g)


def _clamped(g: Gen, short: bool) -> dict[str, Any]:
    """A rank's vocabulary shard looked up by its local ids clamped to its rows (a near miss
    clamps one row short: the last id inside gets the row before its own)."""
    vocab, hidden = 12, g.int(2, 4)
    s, e = g.even_tile(vocab)  # at least 3 ids a rank
    ids = g.ids((2, g.int(3, 5)), vocab)
    ids[0, 0] = e - 1  # the shard's last id
    outside = (ids < s) | (ids >= e)
    return {"W": g.tensor(vocab, hidden), "I": ids, "s": s, "e": e, "m": outside, "h": e - s - (2 if short else 1)}


instance("vocab-clamped-local-lookup")(lambda g: _clamped(g, False))
near_miss("vocab-clamped-local-lookup")(lambda g: _clamped(g, True))


@instance("vocab-masked-lookup-is-partial")
def _(g: Gen) -> dict[str, Any]:
    bindings = _vocab(g)
    ids = bindings["I"]
    mask = (ids < bindings["s"]) | (ids >= bindings["e"])
    return bindings | {"m": mask, "sh": g.text((*ids.shape, 1))}


@near_miss("vocab-masked-lookup-is-partial")
def _(g: Gen) -> dict[str, Any]:
    bindings = _vocab(g)
    hidden = bindings["W"].shape[-1]
    ids = g.ids((2, hidden), bindings["W"].shape[0])  # as many positions as features
    mask = (ids < bindings["s"]) | (ids >= bindings["e"])
    return bindings | {"I": ids, "m": mask, "sh": g.text((2, 1, hidden))}  # masks features, not positions


def _whole_vocab(g: Gen, off_by_one: bool) -> dict[str, Any]:
    """The masking of a vocabulary-parallel embedding at world size 1: [0, V) is all of it. The
    near miss masks [0, V - 1) and looks up the last token, which is then zeroed."""
    bindings = _vocab(g)
    vocab = bindings["W"].shape[0]
    ids = bindings["I"]
    if off_by_one:
        ids = ids.clone()
        ids.view(-1)[0] = vocab - 1
    e = vocab - 1 if off_by_one else vocab
    mask = (ids < 0) | (ids >= e)
    local = ids.masked_fill(mask, 0)
    return bindings | {"I": ids, "e": e, "m": mask, "l": local, "sh": g.text((*ids.shape, 1))}


instance_and_near_miss("vocab-whole-range-lookup", _whole_vocab)


instance_and_near_miss("vocab-whole-range-mask", _whole_vocab)


# ---------------------------------------------------------------------------------------------
# partial sums and shares
# ---------------------------------------------------------------------------------------------
def _partial(
    g: Gen, shape: tuple[int, ...] | None = None, size: int | None = None, kind: str = "sum"
) -> dict[str, Any]:
    """A value X split into K contributions (added, or with `kind` "max" the largest taken), and
    this rank's contribution x of its tile [s, e)."""
    shape = shape or tuple(_shape(g, 3))
    size = size or g.int(4, 8)
    measure = g.contributions(shape, size, kind)
    s, e = g.tile(size)
    return {"X": g.total(measure), "x": measure.part(s, e), "s": s, "e": e, "K": size}


@instance("partial-whole-range")
def _(g: Gen) -> dict[str, Any]:
    size = g.int(2, 6)
    measure = g.contributions(tuple(_shape(g, 2)), size)
    return {"X": g.total(measure), "x": measure.part(0, size), "K": size}


@instance("share-whole")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, 2)), "p": g.int(1, 4)}


@instance("division-is-share")
def _(g: Gen) -> dict[str, Any]:
    return {"X": g.tensor(*_shape(g, 2)), "n": g.int(1, 8)}


@instance("share-of-share")
def _(g: Gen) -> dict[str, Any]:
    q, n = g.int(1, 4), g.int(1, 4)
    return {"X": g.tensor(*_shape(g, 2)), "p": g.int(1, 3), "q": q, "n": n, "m": q * n}


@instance("partial-unary-linear")
def _(g: Gen) -> dict[str, Any]:
    return _partial(g) | {"f": g.pick(_members("linear-unary"))}


@near_miss("partial-unary-linear")
def _(g: Gen) -> dict[str, Any]:
    return _partial(g) | {"f": g.pick(("exp", "relu", "square", "cast_int64"))}


@instance("partial-scaled", "partial-int-scaled")
def _(g: Gen) -> dict[str, Any]:
    c = g.int(1, 4) if g.rule == "partial-int-scaled" else g.pick(("0.5", "-2.0", "3.25"))
    return _partial(g) | {"f": g.pick(_members("scaling")), "c": c}


@near_miss("partial-scaled", "partial-int-scaled")
def _(g: Gen) -> dict[str, Any]:
    c = g.int(1, 4) if g.rule == "partial-int-scaled" else "0.5"
    return _partial(g) | {"f": g.pick(("add", "sub", "pow")), "c": c}


def _two_partials(g: Gen, proportional: bool) -> dict[str, Any]:
    shape = tuple(_shape(g, 2))
    size, scale = g.int(4, 6), g.int(1, 3)
    first, second = g.contributions(shape, size), g.contributions(shape, size * scale)
    s, e = g.tile(size)
    s2, e2 = (s * scale, e * scale) if proportional else (s, e)  # the second tiled as if it had K indices
    return {
        "A": g.total(first),
        "a": first.part(s, e),
        "B": g.total(second),
        "b": second.part(s2, e2),
        "s": s,
        "e": e,
        "K": size,
        "s2": s2,
        "e2": e2,
        "K2": size * scale if proportional else size * 2,
        "f": g.pick(_members("additive")),
    }


@instance("partial-sum-of-partials")
def _(g: Gen) -> dict[str, Any]:
    return _two_partials(g, proportional=True)


@near_miss("partial-sum-of-partials")
def _(g: Gen) -> dict[str, Any]:
    bindings = _two_partials(g, proportional=False)
    measure = g.contributions(bindings["B"].shape, bindings["K2"])
    return bindings | {"B": g.total(measure), "b": measure.part(bindings["s2"], bindings["e2"])}


def _partial_and_share(g: Gen, share_of_all: bool) -> dict[str, Any]:
    bindings = _partial(g)
    A, a = bindings.pop("X"), bindings.pop("x")
    p, q = (1, 1) if share_of_all else (bindings["e"] - bindings["s"], bindings["K"])
    return bindings | {"A": A, "a": a, "B": g.tensor(*A.shape), "p": p, "q": q, "f": g.pick(_members("additive"))}


@instance("partial-plus-share", "share-plus-partial")
def _(g: Gen) -> dict[str, Any]:
    return _partial_and_share(g, share_of_all=False)


@near_miss("partial-plus-share", "share-plus-partial")
def _(g: Gen) -> dict[str, Any] | None:
    if g.world == 1:  # one rank holding the whole bias is right
        return None
    return _partial_and_share(g, share_of_all=True)  # the whole bias added on every rank


@instance("partial-times-replicated", "replicated-times-partial")
def _(g: Gen) -> dict[str, Any]:
    bindings = _partial(g)
    A, a = bindings.pop("X"), bindings.pop("x")
    B = g.tensor(*A.shape).abs() + 0.5
    return bindings | {"A": A, "a": a, "B": B, "f": g.pick(_members("multiplicative"))}


@instance("partial-matmul-replicated", "replicated-matmul-partial")
def _(g: Gen) -> dict[str, Any]:
    bindings = _partial(g)
    A, a = bindings.pop("X"), bindings.pop("x")
    return bindings | {"A": A, "a": a, "B": g.tensor(*A.shape[:-2], A.shape[-1], A.shape[-2])}


@instance("partial-linear-replicated")
def _(g: Gen) -> dict[str, Any]:
    bindings = _partial(g)
    A, a = bindings.pop("X"), bindings.pop("x")
    return bindings | {"A": A, "a": a, "W": g.tensor(g.int(2, 5), A.shape[-1])}


@near_miss("partial-times-replicated")
def _(g: Gen) -> dict[str, Any]:
    bindings = _partial(g)
    A, a = bindings.pop("X"), bindings.pop("x")
    return bindings | {"A": A, "a": a, "B": g.tensor(*A.shape), "f": g.pick(("add", "maximum", "pow"))}


@instance("partial-reduced-again")
def _(g: Gen) -> dict[str, Any]:
    return _partial(g) | {"f": g.pick(_members("additive-reduction")), "d": g.int(-3, -1), "k": g.int(0, 1)}


@near_miss("partial-reduced-again")
def _(g: Gen) -> dict[str, Any]:
    return _partial(g) | {"f": g.pick(("amax", "amin", "logsumexp")), "d": g.int(-3, -1), "k": g.int(0, 1)}


@instance("partial-sliced")
def _(g: Gen) -> dict[str, Any]:
    bindings = _partial(g)
    d = g.int(-3, -1)
    n = bindings["X"].shape[d]
    a = g.int(0, n - 1)
    return bindings | {"d": d, "a": a, "b": g.int(a, n)}


@instance("partial-concatenated")
def _(g: Gen) -> dict[str, Any]:
    d = g.int(-3, -1)
    first = _partial(g)
    shape = list(first["X"].shape)
    shape[d] = g.int(1, 4)
    second = g.contributions(tuple(shape), first["K"])
    return {
        "A": first["X"],
        "a": first["x"],
        "B": g.total(second),
        "b": second.part(first["s"], first["e"]),
        "s": first["s"],
        "e": first["e"],
        "K": first["K"],
        "d": d,
    }


@instance("partial-viewed", "partial-max-viewed")
def _(g: Gen) -> dict[str, Any]:
    kind = "max" if g.rule == "partial-max-viewed" else "sum"
    bindings = _partial(g, shape=(2, 3, 4), kind=kind)
    return bindings | {"s1": g.pick(("6,4", "2,12", "24", "4,3,2", "2,3,1,4", "2,3,4,1")), "sx": "2,3,4"}


@instance("partial-view-sizes", "partial-view-dims", "partial-max-view-sizes", "partial-max-view-dims")
def _(g: Gen) -> dict[str, Any]:
    s1 = g.pick(("6,4", "2,12", "24", "4,3,2", "2,3,1,4"))
    shape = tuple(int(n) for n in s1.split(","))
    size = g.int(4, 8)
    # the contributions to the view V of X
    measure = g.contributions(shape, size, "max" if g.rule.startswith("partial-max") else "sum")
    s, e = g.tile(size)
    view = g.total(measure)
    bindings = {"V": view, "X": view.reshape(2, 3, 4), "y": measure.part(s, e), "s1": s1, "s": s, "e": e, "K": size}
    return bindings | ({"d": g.int(-len(shape), -1)} if g.rule.endswith("view-sizes") else {})


@instance("partial-permuted")
def _(g: Gen) -> dict[str, Any]:
    perm = [0, 1, 2]
    g.random.shuffle(perm)
    return _partial(g) | {"p": g.text(perm)}


@instance("share-scaled")
def _(g: Gen) -> dict[str, Any]:
    A = g.tensor(*_shape(g, 2))
    B = g.tensor(*A.shape).abs() + 0.5
    return {"A": A, "B": B, "p": 1, "q": g.int(1, 4), "f": g.pick(_members("multiplicative"))}


@near_miss("share-scaled")
def _(g: Gen) -> dict[str, Any]:
    A = g.tensor(*_shape(g, 2))
    return {"A": A, "B": g.tensor(*A.shape), "p": 1, "q": g.int(2, 4), "f": g.pick(("add", "sub"))}


def _tiling(g: Gen, kind: str) -> tuple[Any, list[Any], list[tuple[int, int]], int]:
    size = g.int(g.world, g.world + 5)
    measure = g.contributions(tuple(_shape(g, 2)), size, kind)
    tiles = g.tiles(size)
    return g.total(measure), [measure.part(s, e) for s, e in tiles], tiles, size


def _cover_recipes(kind: str, start: str, extend: str, whole: str) -> None:
    """Recipes of the three rules that collect contributions (partial sums or maxes) tiling a
    reduction and give the all-reduce of the tiling its value."""

    @instance(start)
    def _(g: Gen) -> dict[str, Any]:
        Z, parts, tiles, size = _tiling(g, kind)
        return {"Z": Z, "p": parts[0], "e": tiles[0][1], "K": size}

    @instance(extend)
    def _(g: Gen) -> dict[str, Any] | None:
        if g.rank == 0:  # the first tile starts a cover; it does not extend one
            return None
        Z, parts, tiles, size = _tiling(g, kind)
        s, e = tiles[g.rank]
        return {"Z": Z, "ms": MultiSet(parts[: g.rank]), "e": s, "p": parts[g.rank], "f": e, "K": size}

    @instance(whole)
    def _(g: Gen) -> dict[str, Any]:
        Z, parts, _tiles, size = _tiling(g, kind)
        return {"Z": Z, "ms": MultiSet(parts), "K": size}


_cover_recipes("sum", "reduction-cover-start", "reduction-cover-extend", "all-reduce-of-tiling")


def _others(g: Gen, like: Any) -> list[Any]:
    """The other terms of a sum (an expert's output beside a shared expert's partial sums)."""
    return [g.tensor(*like.shape) for _ in range(g.int(1, 2))]


@instance("term-cover-in-sum-start")
def _(g: Gen) -> dict[str, Any]:
    Z, parts, tiles, size = _tiling(g, "sum")
    members = [parts[0], *_others(g, Z)]
    g.random.shuffle(members)
    return {"ms": MultiSet(members), "Z": Z, "p": parts[0], "e": tiles[0][1], "K": size}


@instance("term-cover-in-sum-extend")
def _(g: Gen) -> dict[str, Any] | None:
    if g.rank == 0:  # the first tile starts a collection; it does not extend one
        return None
    Z, parts, tiles, size = _tiling(g, "sum")
    s, e = tiles[g.rank]
    rest = [*parts[g.rank :], *_others(g, Z)]
    g.random.shuffle(rest)
    S = sum(parts[: g.rank], sum(rest[1:], rest[0]))
    return {"S": S, "Z": Z, "rest": MultiSet(rest), "e": s, "p": parts[g.rank], "f": e, "K": size}


@instance("sum-of-term-cover")
def _(g: Gen) -> dict[str, Any]:
    Z, _parts, _tiles, size = _tiling(g, "sum")
    rest = _others(g, Z)
    return {"S": sum(rest, Z), "Z": Z, "rest": MultiSet(rest), "K": size}


def _term_tiling(g: Gen) -> dict[str, Any]:
    """A reduction A tiled over the ranks, a term b, and the rank that carries it."""
    A, parts, tiles, size = _tiling(g, "sum")
    return {
        "A": A,
        "parts": parts,
        "tiles": tiles,
        "K": size,
        "b": g.tensor(*A.shape),
        "carrier": g.int(0, g.world - 1),
    }


@instance("matmul-by-transpose-is-linear")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(2, 5)
    return {"x": g.tensor(*_shape(g, g.int(1, 3)), k), "W": g.tensor(g.int(2, 5), k)}


@instance("partial-plus-term", "term-plus-partial", "partial-plus-term-swapped", "term-plus-partial-swapped")
def _(g: Gen) -> dict[str, Any]:
    t = _term_tiling(g)
    s, e = t["tiles"][g.rank]
    return {"A": t["A"], "a": t["parts"][g.rank], "b": t["b"], "s": s, "e": e, "K": t["K"]}


def _carried(t: dict[str, Any], rank: int) -> Any:
    """Rank `rank`'s all-reduce input: its contribution, plus the term on the carrier."""
    return t["parts"][rank] + (t["b"] if rank == t["carrier"] else 0)


@instance("term-cover-start-plain")
def _(g: Gen) -> dict[str, Any] | None:
    if g.world == 1:  # the one rank carries the term
        return None
    t = _term_tiling(g)
    t["carrier"] = g.int(1, g.world - 1)  # the rank covering [0, e) starts the cover; another carries the term
    s2, e2 = t["tiles"][t["carrier"]]
    A = t["A"]
    return {
        "Y": A + t["b"],
        "A": A,
        "q": _carried(t, t["carrier"]),
        "s2": s2,
        "e2": e2,
        "K": t["K"],
        "p": t["parts"][0],
        "e": t["tiles"][0][1],
    }


@instance("term-cover-start")
def _(g: Gen) -> dict[str, Any] | None:
    t = _term_tiling(g)
    t["carrier"] = 0  # the rank covering [0, e) starts the cover and carries the term
    return {"Y": t["A"] + t["b"], "A": t["A"], "p": _carried(t, 0), "e": t["tiles"][0][1], "K": t["K"]}


def _term_cover_extension(g: Gen, carrying: bool) -> dict[str, Any] | None:
    """Rank r > 0 extends the cover of ranks [0, r); it carries the term or an earlier rank does."""
    if g.rank == 0:
        return None
    t = _term_tiling(g)
    t["carrier"] = g.rank if carrying else g.int(0, g.rank - 1)
    s, e = t["tiles"][g.rank]
    members = MultiSet([_carried(t, r) for r in range(g.rank)])
    copies = 0 if carrying else 1
    return {
        "Y": t["A"] + t["b"],
        "A": t["A"],
        "ms": members,
        "e": s,
        "K": t["K"],
        "n": copies,
        "p": _carried(t, g.rank),
        "f": e,
    }


@instance("term-cover-extend-plain")
def _(g: Gen) -> dict[str, Any] | None:
    return _term_cover_extension(g, carrying=False)


@instance("term-cover-extend")
def _(g: Gen) -> dict[str, Any] | None:
    return _term_cover_extension(g, carrying=True)


@instance("all-reduce-of-tiling-with-term")
def _(g: Gen) -> dict[str, Any]:
    t = _term_tiling(g)
    members = MultiSet([_carried(t, r) for r in range(g.world)])
    return {"Y": t["A"] + t["b"], "A": t["A"], "ms": members, "K": t["K"]}


_cover_recipes("max", "max-cover-start", "max-cover-extend", "all-reduce-max-of-tiling")


# ---------------------------------------------------------------------------------------------
# vocabulary-parallel losses
# ---------------------------------------------------------------------------------------------
def _logits_and_targets(g: Gen, tiled: bool) -> dict[str, Any]:
    """Logits [rows..., K] (or with the classes along another dim) and class-index targets."""
    classes = g.int(max(g.world, 4), 10)
    rows = (g.int(1, 3), g.int(2, 4))
    d = g.pick((-1, -2))
    shape = (*rows, classes) if d == -1 else (rows[0], classes, rows[1])
    s, e = g.tile(classes) if tiled else (0, classes)
    return {"Z": g.tensor(*shape), "I": g.ids(rows, classes), "d": d, "s": s, "e": e}


@instance("target-pick-is-partial")
def _(g: Gen) -> dict[str, Any]:
    return _logits_and_targets(g, tiled=True)


def _whole_classes(g: Gen, off_by_one: bool) -> dict[str, Any]:
    """The masking of a vocabulary-parallel loss at world size 1: [0, K) is all of it. The near
    miss masks [0, K - 1) and has a target K - 1, whose pick is then wrong."""
    bindings = _logits_and_targets(g, tiled=False)
    classes = bindings["Z"].shape[bindings["d"]]
    ids = bindings["I"]
    if off_by_one:
        ids = ids.clone()
        ids.view(-1)[0] = classes - 1
    end = classes - 1 if off_by_one else classes
    mask = outside(ids, 0, end)
    return bindings | {"I": ids, "K": end, "m": mask, "l": torch.where(mask, 0, ids)}


instance_and_near_miss("target-whole-range-pick", _whole_classes)


instance_and_near_miss("target-whole-range-mask", _whole_classes)
