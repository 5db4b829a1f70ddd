"""Index the relations egglog proved, by reference value and rank, in the graphs' own terms."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, replace

from ..graph.model import Graph
from .engine import Facts, Ranges
from .factored_terms import SCALED_SUFFIX


@dataclass(frozen=True)
class Relation:
    """How a rank value relates to a reference value (see verify/language.py)."""

    kind: str  # equal | sel | selw | psum | pmax | frac | permuted
    part: int  # e-class of the rank value
    dim: int = 0
    ranges: Ranges = ()
    start: int = 0
    end: int = 0
    total: int = 0
    num: int = 1
    den: int = 1
    lo: int = 0
    hi: int = 0
    length: int = 0
    # the rank value is this relation's value with its dims permuted (`x.permute(perm)`, the text
    # "1,0,2"): kept on psum / pmax / frac, which say nothing of dims; an equal, sel or selw
    # relation permuted is kind `permuted`, its own kind in `inner` (its dims are the unpermuted
    # value's), so that no reader takes it for a plain one
    perm: str = ""
    inner: str = ""

    def describe(self, shape: tuple[int, ...] | None = None, reduced: str = "reduced indices") -> str:
        if self.perm:
            plain = replace(self, kind=self.inner or self.kind, perm="", inner="")
            return f"{plain.describe(shape, reduced)}, with its dims in the order ({self.perm.replace(',', ', ')})"
        if self.kind == "equal":
            return "the full value (replicated)"
        if self.kind == "sel":
            dim = _dim_name(self.dim, shape)
            return f"the slice {ranges_text(self.ranges)} of {dim}"
        if self.kind == "selw":
            return (
                f"a replicated slice of {self.length} taken anywhere in [{self.lo}:{self.hi + self.length}] of "
                f"{_dim_name(self.dim, shape)}"
            )
        if self.kind == "psum":
            return f"a partial sum over [{self.start}:{self.end}] of the {self.total} {reduced}"
        if self.kind == "pmax":
            return f"a partial max over [{self.start}:{self.end}] of the {self.total} {reduced}"
        if self.kind == "frac":
            return f"{self.num}/{self.den} of the value"
        return self.kind


def ranges_text(ranges: Ranges) -> str:
    """Ranges as `[s:e], ...`; a long run of equal ranges at a fixed step (every k-th row of a
    round-robin shard) as its first and last ranges and the step."""
    spans = [f"[{s}:{e}]" for s, e in ranges]
    if len(ranges) > 3:
        steps = {b[0] - a[0] for a, b in itertools.pairwise(ranges)}
        lengths = {e - s for s, e in ranges}
        if len(steps) == 1 and len(lengths) == 1:
            (step,) = steps
            return f"{spans[0]}, {spans[1]}, ..., {spans[-1]} (every {step} from {ranges[0][0]}, {len(ranges)} ranges)"
    return ", ".join(spans)


def _dim_name(dim: int, shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return f"dim {dim}"
    return f"dim {len(shape) + dim} (size {shape[dim]})"


class RelationIndex:
    def __init__(self, reference: Graph, ranks: list[Graph], facts: Facts) -> None:
        self.reference = reference
        self.ranks = ranks
        self.facts = facts
        self.cls: dict[tuple[str, str], int] = {}
        self.members: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for name, c in facts.classes.items():
            graph, _, value = name.partition("/")
            self.cls[(graph, value)] = c
            if not value.endswith(SCALED_SUFFIX):  # an unscaled value is looked up, never listed
                self.members[c].append((graph, value))
        self.by_ref: dict[int, list[Relation]] = defaultdict(list)
        for ref, part, dim, ranges in facts.sel:
            self.by_ref[ref].append(Relation("sel", part, dim=dim, ranges=ranges))
        for ref, part, dim, lo, hi, n in facts.selw:
            self.by_ref[ref].append(Relation("selw", part, dim=dim, lo=lo, hi=hi, length=n))
        for ref, part, s, e, k in facts.psum:
            self.by_ref[ref].append(Relation("psum", part, start=s, end=e, total=k))
        for ref, part, s, e, k in facts.pmax:
            self.by_ref[ref].append(Relation("pmax", part, start=s, end=e, total=k))
        for ref, part, p, q in facts.frac:
            self.by_ref[ref].append(Relation("frac", part, num=p, den=q))
        # permuted layouts: the classes holding a permutation of a class, and the reverse
        self.permuted: dict[int, list[tuple[int, str]]] = defaultdict(list)  # inner -> (outer, perm)
        self.unpermuted: dict[int, list[tuple[int, str]]] = defaultdict(list)  # outer -> (inner, perm)
        for outer, inner, perm in facts.permute:
            self.permuted[inner].append((outer, perm))
            self.unpermuted[outer].append((inner, perm))

    # -- lookups ----------------------------------------------------------------------------------
    def class_of(self, graph: str, value: str) -> int | None:
        return self.cls.get((graph, value))

    def values_in(self, c: int, graph: str) -> list[str]:
        return [v for g, v in self.members.get(c, []) if g == graph]

    def has_reference_member(self, c: int) -> bool:
        return any(g == "reference" for g, _ in self.members.get(c, []))

    def reference_values(self, c: int) -> list[str]:
        return self.values_in(c, "reference")

    def relations(self, ref_value: str, rank: int, every: bool = False) -> list[tuple[Relation, list[str]]]:
        """Every proven relation between a reference value and rank `rank`'s values; permuted ones
        only where no plain one holds, unless `every`."""
        c = self.class_of("reference", ref_value)
        if c is None:
            return []
        graph = f"rank{rank}"
        found: list[tuple[Relation, list[str]]] = []
        same = self.values_in(c, graph)
        if same:
            found.append((Relation("equal", c), same))
        for rel in self.by_ref.get(c, []):
            values = self.values_in(rel.part, graph)
            if values and rel.part != c:
                found.append((rel, values))
        if every or not found:  # a permuted layout relates only what nothing relates plainly
            for rel in [Relation("equal", c), *self.by_ref.get(c, [])]:
                for outer, perm in self.permuted.get(rel.part, []):
                    values = self.values_in(outer, graph)
                    if values:
                        found.append((_permuted(rel, outer, perm), values))
        return found

    def related(self, ref_value: str, rank: int) -> bool:
        return bool(self.relations(ref_value, rank))

    def relations_of_rank_value(self, rank: int, value: str) -> list[tuple[Relation, list[str]]]:
        """Relations in which a rank value takes part, with the reference values they relate it to."""
        c = self.class_of(f"rank{rank}", value)
        if c is None:
            return []
        out = self._held_by(c)
        if not out:  # a permuted layout relates only what nothing relates plainly
            for inner, perm in self.unpermuted.get(c, []):
                out.extend((_permuted(rel, c, perm), refs) for rel, refs in self._held_by(inner))
        return out

    def _held_by(self, c: int) -> list[tuple[Relation, list[str]]]:
        """The relations whose rank value is the class `c`, with the reference values of each."""
        out: list[tuple[Relation, list[str]]] = []
        refs = self.reference_values(c)
        if refs:
            out.append((Relation("equal", c), refs))
        for ref_class, rels in self.by_ref.items():
            for rel in rels:
                if rel.part == c and ref_class != c:
                    ref_values = self.reference_values(ref_class)
                    if ref_values:
                        out.append((rel, ref_values))
        return out


def _permuted(rel: Relation, part: int, perm: str) -> Relation:
    """`rel` of the value `part` holds a permutation of (see `Relation.perm`)."""
    if rel.kind in ("psum", "pmax", "frac"):
        return replace(rel, part=part, perm=perm)
    return replace(rel, kind="permuted", inner=rel.kind, part=part, perm=perm)
