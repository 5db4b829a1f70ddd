"""Where a wrong cut's numbers were computed: the line to change when a slice is right in form but
its offsets or sizes are not.

The builder's numbers are traced from the rank and the world size (capture/numbers.py), so every
cut `W[a:b]` / `W.narrow(d, a, n)` knows how its bounds were computed, line by line. The question
"which line is wrong" is answered the way a developer would test a suspicion: replace one
computed number by another value (the same on every rank when the number does not read the rank,
else any value per rank), recompute everything computed from it, and see whether the ranks' cuts
then tile the dim: consecutive, non-empty blocks in rank order covering it once (every row- or
column-parallel layout, even or uneven). The earliest computation for which such a value exists
is where the mistake is (a later one only compensates for it); when that is the cut's own line,
the cut is what to change. A number that also feeds other calls (a shape, another cut) may only
be blamed when those calls cut the same block.

When no single number can make the cuts tile (the layout is not a tiling: key/value heads
replicated over groups of ranks), a cut that takes one block `[k*size:(k+1)*size]` of a block
index `k` computed from the rank is reported where `k` was computed: the cut only turns the
index into rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from ..graph.model import Frame
from ..graph.numbers import Bound, BuilderNumbers, NumberStep, NumberUse
from ..results import Discrepancy
from .plain_numbers import plain_operands
from .sites import Line, line_of, to_site


@dataclass(frozen=True)
class NumberOrigin:
    frame: Frame  # the computation to change, with its expression's columns
    use: Frame  # the cut that used the number
    how: str  # why this line: "tiling" or "block index"


@dataclass
class _Cut:
    rank: int
    use: NumberUse
    size: int  # the cut dim's size
    # further cuts the rank joins to this one, in order (a shard assembled head by head: `cat([W[h *
    # d : (h + 1) * d] for h in heads])`): together one range when each starts where the last ends
    more: tuple[NumberUse, ...] = ()

    @property
    def uses(self) -> tuple[NumberUse, ...]:
        return (self.use, *self.more)

    def parts(self) -> list[_Cut]:
        return [_Cut(self.rank, use, self.size) for use in self.uses]


def cuts_at(rank_numbers: list[BuilderNumbers], line: Line, size: int | None = None) -> dict[int, list[_Cut]]:
    """Per rank, the cuts made at `line` (of a dim of `size`, when given)."""
    found: dict[int, list[_Cut]] = {}
    for rank, numbers in enumerate(rank_numbers):
        for use in numbers.uses:
            if use.cut is None or use.dim is None or use.frame is None or line_of(use.frame) != line:
                continue
            if not -len(use.shape) <= use.dim < len(use.shape):
                continue
            dim_size = use.shape[use.dim]
            if size is None or dim_size == size:
                found.setdefault(rank, []).append(_Cut(rank, use, dim_size))
    return found


def cut_lines(rank_numbers: list[BuilderNumbers], held: dict[int, tuple[int, int]], size: int) -> list[Line]:
    """The lines whose cuts of a dim of `size` hold exactly `held` (rank -> [start, end)) on every
    rank listed: where a layout of ranges came from."""
    lines: list[Line] = []
    candidates = {line_of(u.frame) for n in rank_numbers for u in n.uses if u.cut is not None and u.frame is not None}
    for line in sorted(candidates):
        cuts = cuts_at(rank_numbers, line, size)
        if held and all(any(_range_now(c) == held[r] for c in cuts.get(r, [])) for r in held):
            lines.append(line)
    return lines


def number_origin(
    rank_numbers: list[BuilderNumbers],
    line: Line,
    held: dict[int, tuple[int, int]] | None = None,
    expected: dict[int, tuple[int, int]] | None = None,
) -> NumberOrigin | None:
    """The computation to change for the cuts at `line` (None: the cut itself, or nothing traced).
    `held`: the ranges the ranks' cuts are known to hold (chooses among several cuts at the line).
    `expected`: the ranges the ranks' cuts should hold, when the report knows them (the rows a
    vocabulary mask keeps): the change must give exactly those, not merely some tiling."""
    by_rank = cuts_at(rank_numbers, line)
    chosen: dict[int, _Cut] = {}
    for rank, cuts in by_rank.items():
        matching = [c for c in cuts if held is None or rank not in held or _range_now(c) == held[rank]]
        if matching:
            chosen[rank] = matching[0]
    origin = _origin_of(rank_numbers, line, chosen, expected)
    joined = _joined(by_rank) if held is None else None
    if origin is None and joined is not None:
        # several cuts per rank at the line (a shard taken head by head): as one cut each
        origin = _origin_of(rank_numbers, line, joined, expected)
    return origin


def _origin_of(
    rank_numbers: list[BuilderNumbers],
    line: Line,
    chosen: dict[int, _Cut],
    expected: dict[int, tuple[int, int]] | None,
) -> NumberOrigin | None:
    if len(chosen) < 2 or len({c.size for c in chosen.values()}) != 1:
        return None
    use_frame = next(iter(chosen.values())).use.frame
    assert use_frame is not None
    size = next(iter(chosen.values())).size
    if expected is None and _tiles_when_changed(chosen, {}, np.zeros(1), size):
        return None  # the cuts tile as they are: what is wrong is not where they cut
    found, how = _by_tiling(rank_numbers, chosen, expected), "tiling"
    if found is None:
        found, how = _by_block_index(chosen), "block index"
    if found is None or found.frame is None or line_of(found.frame) == line:
        return None
    return NumberOrigin(_widest_on_line(found, chosen), use_frame, how)


def _joined(by_rank: dict[int, list[_Cut]]) -> dict[int, _Cut] | None:
    """Every rank's several cuts at the line, of one dim, as one cut each (the pieces of a shard
    taken head by head): when every rank makes as many, more than one."""
    counts = {len(cuts) for cuts in by_rank.values()}
    sizes = {cut.size for cuts in by_rank.values() for cut in cuts}
    if len(by_rank) < 2 or len(counts) != 1 or counts == {1} or len(sizes) != 1:
        return None
    return {rank: replace(cuts[0], more=tuple(c.use for c in cuts[1:])) for rank, cuts in by_rank.items()}


def relocated(
    found: Discrepancy, rank_numbers: list[BuilderNumbers], held: dict[int, tuple[int, int]] | None = None
) -> Discrepancy:
    """A discrepancy reported at a cut moved to where the cut's numbers were computed, when that
    is another line (the cut stays as related information)."""
    if found.primary is None or not rank_numbers:
        return found
    origin = number_origin(rank_numbers, (found.primary.file, found.primary.line), held)
    if origin is None:
        return found
    return moved_to(found, origin)


def moved_to(found: Discrepancy, origin: NumberOrigin) -> Discrepancy:
    """`found` reported where its cut's numbers were computed: the cut, and the line first blamed
    (when it is another), become related information."""
    why = (
        "the block index it cuts with is computed here"
        if origin.how == "block index"
        else "the offsets and sizes of this cut are computed here"
    )
    first = found.primary
    cut = to_site(origin.use, "the cut that uses this number")
    found.primary = to_site(origin.frame, why)
    related = [cut] if cut is not None else []
    if first is not None and (cut is None or (first.file, first.line) != (cut.file, cut.line)):
        related.append(first)
    found.related[:0] = related
    where = cut.short() if cut is not None else "its cut"
    found.suggestion = f"change how this number is computed (the cut at {where} uses it); {found.suggestion}"
    found.details["number_origin"] = {"how": origin.how, "use": origin.use.location()}
    return found


# -- replaying a derivation with one number changed ----------------------------------------------


def _steps(bound: Bound) -> list[NumberStep]:
    return bound.ancestors() if isinstance(bound, NumberStep) else []


Substitutions = dict[int, dict[int, NumberStep]]  # id(step) -> operand index -> the plain number's step


def _evaluate(
    bound: Bound, changed: set[int], value: np.ndarray, memo: dict[int, object], subs: Substitutions | None = None
) -> object:
    """The bound's value with every step in `changed` (by identity) replaced by `value`; a plain
    operand with a step in `subs` is read through that step."""
    if not isinstance(bound, NumberStep):
        return bound
    key = id(bound)
    if key in memo:
        return memo[key]
    if key in changed:
        result: object = value
    elif not bound.operands:
        result = float(bound.value)
    else:
        own = (subs or {}).get(key, {})
        operands = [
            _evaluate(own.get(i, o), changed, value, memo, subs) if isinstance(own.get(i, o), NumberStep) else float(o)
            for i, o in enumerate(bound.operands)
        ]
        result = _apply(bound.op, operands)
    memo[key] = result
    return result


def _apply(op: str, operands: list[object]) -> object:
    a = operands[0]
    b = operands[1] if len(operands) > 1 else None
    with np.errstate(all="ignore"):
        match op:
            case "+":
                return np.add(a, b)
            case "-":
                return np.subtract(a, b)
            case "*":
                return np.multiply(a, b)
            case "/":
                return np.true_divide(a, b)
            case "//":
                return np.floor_divide(a, b)
            case "%":
                return np.mod(a, b)
            case "**":
                return np.power(np.asarray(a, dtype=float), b)
            case "neg":
                return np.negative(a)
            case "pos":
                return a
            case "abs":
                return np.abs(a)
            case "floor" | "trunc":
                return np.floor(a) if op == "floor" else np.trunc(a)
            case "ceil":
                return np.ceil(a)
            case "round":
                return np.round(a)
            case "min":
                return np.minimum.reduce(np.broadcast_arrays(*operands))
            case "max":
                return np.maximum.reduce(np.broadcast_arrays(*operands))
            case "sqrt":
                return np.sqrt(a)
    return np.full(np.shape(a), np.nan)


def _range_of(
    cut: _Cut, changed: set[int], value: np.ndarray, subs: Substitutions | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of the cut for every candidate value (Python's slice clamping; a narrow out of
    bounds is no range at all: start = end = -1). Joined cuts are one range where each piece
    starts where the one before ends."""
    if cut.more:
        pieces = [_range_of(part, changed, value, subs) for part in cut.parts()]
        start, end = pieces[0]
        for piece_start, piece_end in pieces[1:]:
            joins = (piece_start == end) & (piece_end > piece_start) & (end > start)
            start, end = np.where(joins, start, -1.0), np.where(joins, piece_end, -1.0)
        return start, end
    assert cut.use.cut is not None
    kind, first, second = cut.use.cut
    memo: dict[int, object] = {}
    n = float(cut.size)
    a = np.broadcast_to(np.asarray(_evaluate(first, changed, value, memo, subs), dtype=float), value.shape)
    b = np.broadcast_to(np.asarray(_evaluate(second, changed, value, memo, subs), dtype=float), value.shape)
    if kind == "narrow":
        start = np.where(a < 0, a + n, a)
        end = start + b
        bad = (start < 0) | (end > n) | (b < 0) | ~np.isfinite(start + end)
        return np.where(bad, -1.0, start), np.where(bad, -1.0, end)
    start = np.zeros_like(value, dtype=float) if first is None else np.clip(np.where(a < 0, a + n, a), 0, n)
    end = np.full(value.shape, n) if second is None else np.clip(np.where(b < 0, b + n, b), 0, n)
    bad = ~np.isfinite(start + end) | (start != np.floor(start)) | (end != np.floor(end))
    # a bound the code computes as a position stays one: counting from the end (a negative
    # index) is another way of cutting, not a value the code's number could take
    for bound, raw in ((first, a), (second, b)):
        if isinstance(bound, NumberStep) and bound.value >= 0:
            bad |= raw < 0
    end = np.maximum(end, start)
    return np.where(bad, -1.0, start), np.where(bad, -1.0, end)


def _range_now(cut: _Cut) -> tuple[int, int]:
    start, end = _range_of(cut, set(), np.zeros(1))
    return int(start[0]), int(end[0])


# -- which computation: the tiling test -----------------------------------------------------------


def _point(step: NumberStep) -> tuple[object, ...] | None:
    """A step's place in the program (the same on every rank that runs the same code)."""
    if step.frame is None or step.is_origin:
        return None
    f = step.frame
    return (f.file, f.line, f.column, f.end_column, step.op)


def _by_tiling(
    rank_numbers: list[BuilderNumbers], chosen: dict[int, _Cut], expected: dict[int, tuple[int, int]] | None = None
) -> NumberStep | None:
    steps: dict[tuple[object, ...], dict[int, list[NumberStep]]] = {}
    subs: Substitutions = {}
    for rank, cut in chosen.items():
        derivation = {id(s): s for use in cut.uses if use.cut is not None for b in use.cut[1:] for s in _steps(b)}
        for step in list(derivation.values()):
            plain = plain_operands(step)
            if plain:
                subs[id(step)] = plain
                derivation.update({id(p): p for p in plain.values()})
        for step in derivation.values():
            point = _point(step)
            if point is not None:
                steps.setdefault(point, {}).setdefault(rank, []).append(step)
    size = next(iter(chosen.values())).size
    first_rank = min(chosen)
    ordered = sorted(steps, key=lambda p: min(s.order for s in steps[p].get(first_rank, steps[p][min(steps[p])])))
    domain = np.arange(-size - 1, 2 * size + 3, dtype=float)
    usable = [p for p in ordered if _only_feeds_this_cut(rank_numbers, chosen, steps[p])]
    # First as the code reads: a number computed without the rank changes to one value on every
    # rank. Only when no line can be changed that way, a number that should have read the rank and
    # did not (every rank cuts the same block) may take a value per rank.
    for per_rank_values in (False, True):
        for point in usable:
            if expected is not None:
                if _gives_when_changed(chosen, steps[point], domain, expected, per_rank_values, subs):
                    return next(iter(steps[point].values()))[0]
            elif _tiles_when_changed(chosen, steps[point], domain, size, per_rank_values, subs):
                return next(iter(steps[point].values()))[0]
    return None


def _gives_when_changed(
    chosen: dict[int, _Cut],
    per_rank: dict[int, list[NumberStep]],
    domain: np.ndarray,
    expected: dict[int, tuple[int, int]],
    per_rank_values: bool = False,
    subs: Substitutions | None = None,
) -> bool:
    """Whether one value of the changed number (one per rank, for a number that reads the rank)
    makes every chosen cut hold exactly its expected range."""
    reads_rank = per_rank_values or _reads_rank(per_rank)
    ok = np.ones(domain.shape, dtype=bool)
    for rank, (start, end) in _ranges_when_changed(chosen, per_rank, domain, subs).items():
        if rank not in expected:
            continue
        hits = (start == expected[rank][0]) & (end == expected[rank][1])
        if reads_rank:
            if not hits.any():
                return False
        else:
            ok &= hits
    return reads_rank or bool(ok.any())


def _only_feeds_this_cut(
    rank_numbers: list[BuilderNumbers], chosen: dict[int, _Cut], per_rank: dict[int, list[NumberStep]]
) -> bool:
    """Changing the number changes nothing but cuts of the same block (the loader cuts every
    parameter of a layer with one start and end): a number that also sizes something else is
    right for that use."""
    for rank, changed in per_rank.items():
        ids = {id(s) for s in changed}
        expected = {_range_now(part) for part in chosen[rank].parts()}
        for use in rank_numbers[rank].uses:
            if not any(id(s) in ids for _, step in use.roles for s in step.ancestors()):
                continue
            if use.cut is None or use.dim is None or not -len(use.shape) <= use.dim < len(use.shape):
                return False
            if _range_now(_Cut(rank, use, use.shape[use.dim])) not in expected:
                return False
    return True


def _tiles_when_changed(
    chosen: dict[int, _Cut],
    per_rank: dict[int, list[NumberStep]],
    domain: np.ndarray,
    size: int,
    per_rank_values: bool = False,
    subs: Substitutions | None = None,
) -> bool:
    reads_rank = per_rank_values or _reads_rank(per_rank)
    ranges = _ranges_when_changed(chosen, per_rank, domain, subs)
    ranks = sorted(ranges)
    if not reads_rank:
        # one value for every rank: the ranks' blocks follow each other for some value
        ok = np.ones(domain.shape, dtype=bool)
        for position, rank in enumerate(ranks):
            start, end = ranges[rank]
            ok &= end > start
            ok &= start == (0 if position == 0 else ranges[ranks[position - 1]][1])
        ok &= ranges[ranks[-1]][1] == size
        return bool(ok.any())
    reachable = {0.0}
    for rank in ranks:
        start, end = ranges[rank]
        pairs = {(s, e) for s, e in zip(start.tolist(), end.tolist(), strict=True) if e > s}
        reachable = {e for s, e in pairs if s in reachable}
        if not reachable:
            return False
    return float(size) in reachable


def _reads_rank(per_rank: dict[int, list[NumberStep]]) -> bool:
    return any(s.reads_rank() for steps in per_rank.values() for s in steps)


def _ranges_when_changed(
    chosen: dict[int, _Cut], per_rank: dict[int, list[NumberStep]], domain: np.ndarray, subs: Substitutions | None
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each chosen cut's [start, end) for every value in `domain` of the changed number (no range,
    -1, where a per-rank share would change by more than its rounding)."""
    ranges = {}
    for rank, cut in chosen.items():
        changed = {id(s) for s in per_rank.get(rank, [])}
        start, end = _range_of(cut, changed, domain, subs)
        shares = [share_of(s) for s in per_rank.get(rank, [])]
        if shares and shares[0] is not None:
            # a per-rank share (n // world size) is right as a share: only its rounding may be wrong
            rounding = np.abs(domain - shares[0]) < 1
            start, end = np.where(rounding, start, -1.0), np.where(rounding, end, -1.0)
        ranges[rank] = (start, end)
    return ranges


# -- which computation: the block index ---------------------------------------------------------


def _by_block_index(chosen: dict[int, _Cut]) -> NumberStep | None:
    """The number k of a cut [k*size : (k+1)*size] of one size on every rank, when k reads the rank
    and is computed before the cut (the cut turns it into rows; k says which block)."""
    found: NumberStep | None = None
    widths: set[int] = set()
    if any(cut.more for cut in chosen.values()):
        return None
    for cut in chosen.values():
        assert cut.use.cut is not None
        _, first, second = cut.use.cut
        if not isinstance(first, NumberStep) or not isinstance(second, NumberStep):
            return None
        start, end = _range_now(cut)
        widths.add(end - start if cut.use.cut[0] == "slice" else int(second.value))
        shared = {id(s): s for s in first.ancestors()}.keys() & {id(s): s for s in second.ancestors()}.keys()
        common = [s for s in first.ancestors() if id(s) in shared and not s.is_origin and s.reads_rank()]
        if not common:
            return None
        latest = max(common, key=lambda s: s.order)
        if found is None:
            found = latest
        elif _point(found) != _point(latest):
            return None
    return found if len(widths) == 1 and 0 not in widths else None


def share_of(step: NumberStep) -> float | None:
    """n / world size when the step divides n by the world size itself (`n // world_size`): a
    per-rank share."""
    if step.op not in ("//", "/") or len(step.operands) != 2:
        return None
    dividend, divisor = step.operands
    if not isinstance(divisor, NumberStep) or divisor.op != "world size":
        return None
    value = dividend.value if isinstance(dividend, NumberStep) else dividend
    return float(value) / float(divisor.value)


def _widest_on_line(step: NumberStep, chosen: dict[int, _Cut]) -> Frame:
    """The whole expression on the culprit's line that computes the number the cut receives
    (`(rank + 1) * rows` rather than `rank + 1`)."""
    assert step.frame is not None
    line = line_of(step.frame)
    best = step
    for cut in chosen.values():
        bounds = [b for use in cut.uses if use.cut is not None for b in use.cut[1:]]
        for bound in bounds:
            for s in _steps(bound):
                on_line = s.frame is not None and line_of(s.frame) == line
                if on_line and s.order > best.order and step in _iter_ancestors(s):
                    best = s
        break
    assert best.frame is not None
    return best.frame


def _iter_ancestors(step: NumberStep) -> Iterable[NumberStep]:
    return step.ancestors()
