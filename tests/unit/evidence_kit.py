"""Hand-built evidence for the localizer's detector tests: the graphs capture would make and the
relations a saturation would prove between them, without capture or egglog.

    kit = Kit(world_size=2)
    kit.input("x", 2, 8, 16)                      # the same input in every program, replicated
    kit.ref.op("h", "linear", "x", "w", out=(2, 8, 16), line=10, module="up")
    for r, rank in kit.each_rank():
        rank.op("h", "linear", "x", "w", out=(2, 8, 16), line=40)
        kit.psum("h", f"rank{r}/h", 8 * r, 8 * r + 8, 16)
    ctx = kit.context()

A value is named as the relation facts name it, `graph/value` (`rank1/h`); a bare name is the
reference's. The reference's lines are in REFERENCE_FILE, the ranks' in PARALLEL_FILE, so that a
rank's line is never mistaken for code it shares with the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

from shardproof.graph.model import Collective, Frame, Graph, Node, Placeholder, SourceSite, TensorMeta
from shardproof.localize.context import Context
from shardproof.localize.evidence import Evidence
from shardproof.results import Discrepancy
from shardproof.verify.engine import Facts
from shardproof.verify.relations_found import RelationIndex

F32 = "float32"
I64 = "int64"
REFERENCE_FILE = "/project/reference.py"
PARALLEL_FILE = "/project/parallel.py"


def meta(*shape: int, dtype: str = F32) -> TensorMeta:
    return TensorMeta(tuple(shape), dtype)


def frame(line: int, file: str = PARALLEL_FILE, function: str = "forward", library: str | None = None) -> Frame:
    return Frame(file, line, function, f"<line {line}>", 4, line, 40, library)


def site(*frames: Frame | int, file: str = PARALLEL_FILE) -> SourceSite:
    """A call's frames, outermost first (a bare line number is a frame of `file`)."""
    return SourceSite(tuple(f if isinstance(f, Frame) else frame(f, file) for f in frames))


def context(reference: Graph, ranks: list[Graph], facts: Facts, **evidence: object) -> Context:
    """The localizer's context over graphs and the facts a saturation proved about them."""
    index = RelationIndex(reference, ranks, facts)
    values = evidence.pop("rank_values", [{} for _ in ranks])
    issues = evidence.pop("issues", [])
    return Context(Evidence(reference, ranks, values, index, issues, **evidence))  # type: ignore[arg-type]


class Program:
    """One graph under construction: the reference (rank None) or one rank."""

    def __init__(self, name: str, rank: int | None, world_size: int, file: str) -> None:
        self.graph = Graph(name, rank, world_size, [], [], [])
        self.file = file

    @property
    def name(self) -> str:
        return self.graph.name

    def placeholder(self, value: str, kind: str, target: str, /, *shape: int, dtype: str = F32) -> Placeholder:
        placeholder = Placeholder(value, kind, target, meta(*shape, dtype=dtype))
        self.graph.placeholders.append(placeholder)
        return placeholder

    def parameter(self, value: str, target: str, *shape: int) -> Placeholder:
        return self.placeholder(value, "parameter", target, *shape)

    def op(
        self,
        value: str,
        op: str,
        /,
        *inputs: str,
        out: tuple[int, ...],
        line: int | None = None,
        frames: tuple[Frame, ...] = (),
        module: str = "",
        collective: Collective | None = None,
        original: str = "",
        dtype: str = F32,
        **attrs: object,
    ) -> Node:
        """A node `value = op(*inputs)` of shape `out`, run at `line` of the program's file (or
        `frames`, outermost first); keyword arguments are the node's attributes (fn=, value=, dim=)."""
        where = SourceSite(frames) if frames else (site(line, file=self.file) if line is not None else None)
        node = Node(
            value, op, tuple(inputs), dict(attrs), meta(*out, dtype=dtype), where, module, "", collective, original
        )
        self.graph.nodes.append(node)
        return node

    def all_reduce(
        self,
        value: str,
        source: str,
        /,
        *,
        out: tuple[int, ...],
        line: int,
        op: str = "sum",
        group: tuple[int, ...] = (),
    ) -> Node:
        group = group or tuple(range(self.graph.world_size))
        return self.op(value, "all_reduce", source, out=out, line=line, collective=Collective("all_reduce", op, group))

    def output(self, *values: str) -> None:
        self.graph.outputs.extend(values)


class Kit:
    """The reference, `world_size` ranks, the facts relating them and the rest of the evidence."""

    def __init__(self, world_size: int = 2) -> None:
        self.ref = Program("reference", None, 1, REFERENCE_FILE)
        self.ranks = [Program(f"rank{r}", r, world_size, PARALLEL_FILE) for r in range(world_size)]
        self.facts = Facts()
        self.evidence: dict[str, object] = {}  # further Evidence fields: outputs_of, factors, issues ...

    def each_rank(self) -> Iterator[tuple[int, Program]]:
        return iter(enumerate(self.ranks))

    @property
    def programs(self) -> list[Program]:
        return [self.ref, *self.ranks]

    # -- values every program has ------------------------------------------------------------------
    def input(self, value: str, *shape: int, target: str = "0", dtype: str = F32) -> None:
        """An input every program receives whole (one e-class: replicated)."""
        for program in self.programs:
            program.placeholder(value, "input", target, *shape, dtype=dtype)
        self.equal(value, *(f"{p.name}/{value}" for p in self.ranks))

    # -- the relations saturation proved ------------------------------------------------------------
    def cls(self, name: str) -> int:
        """The e-class of a value (a new one the first time it is named)."""
        key = _qualified(name)
        if key not in self.facts.classes:
            self.facts.classes[key] = max(self.facts.classes.values(), default=0) + 1
        return self.facts.classes[key]

    def equal(self, *names: str) -> int:
        """The values are one e-class (equal: a rank value replicating a reference value)."""
        keys = [_qualified(n) for n in names]
        known = {self.facts.classes[k] for k in keys if k in self.facts.classes}
        assert len(known) <= 1, f"{names} are already in different classes"
        c = known.pop() if known else self.cls(keys[0])
        for key in keys:
            self.facts.classes[key] = c
        return c

    def sel(self, ref: str, part: str, dim: int, *ranges: tuple[int, int]) -> None:
        self.facts.sel.append((self.cls(ref), self.cls(part), dim, tuple(ranges)))

    def blocks(self, ref: str, part: str, dim: int, size: int) -> None:
        """Rank r's `part` (`{rank}` in its name) is block r of `size` along `dim`."""
        for r, _ in self.each_rank():
            block = size // len(self.ranks)
            self.sel(ref, part.format(rank=r), dim, (r * block, r * block + block))

    def psum(self, ref: str, part: str, start: int, end: int, total: int) -> None:
        self.facts.psum.append((self.cls(ref), self.cls(part), start, end, total))

    def partial_blocks(self, ref: str, part: str, total: int) -> None:
        """Rank r's `part` is the partial sum over block r of the `total` reduced indices."""
        for r, _ in self.each_rank():
            block = total // len(self.ranks)
            self.psum(ref, part.format(rank=r), r * block, r * block + block, total)

    def pmax(self, ref: str, part: str, start: int, end: int, total: int) -> None:
        self.facts.pmax.append((self.cls(ref), self.cls(part), start, end, total))

    def permute(self, outer: str, inner: str, perm: str) -> None:
        """The class of `outer` holds `inner.permute(perm)` (perm as "1,0,2")."""
        self.facts.permute.append((self.cls(outer), self.cls(inner), perm))

    def frac(self, ref: str, part: str, num: int, den: int) -> None:
        self.facts.frac.append((self.cls(ref), self.cls(part), num, den))

    def factor(self, name: str, factor: Fraction) -> None:
        """The constant factor the encoder carried outside a value of a joint graph."""
        graph, _, value = _qualified(name).partition("/")
        factors = self.evidence.setdefault("factors", {})
        factors[(graph, value)] = factor  # type: ignore[index]

    def context(self) -> Context:
        return context(self.ref.graph, [p.graph for p in self.ranks], self.facts, **dict(self.evidence))


def _qualified(name: str) -> str:
    return name if "/" in name else f"reference/{name}"


def at(found: Discrepancy | None) -> tuple[str, int] | None:
    """Where a report puts the fix: (file, line) of its primary site."""
    assert found is not None
    return None if found.primary is None else (found.primary.file, found.primary.line)
