"""Saturate one verification unit under bounds and read back the relations it proved.

Runs inside a sandbox process (see sandbox.py): an out-of-memory abort or a panic ends that
process, never the caller. The result is plain data (JSON-able): e-class ids are small ints.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import rules, statements
from .egglog_adapter import EgglogError, EGraph
from .language import DECLARATIONS

ITERATIONS_PER_CHUNK = 8

Ranges = tuple[tuple[int, int], ...]


# What a saturation's facts hold (`read_facts`): a stored saturation read in another format would
# lack what the localizer now reads (version 2: the permutations of related values)
FACTS_FORMAT = "facts 2"


@dataclass
class Facts:
    classes: dict[str, int] = field(default_factory=dict)  # "graph/value" -> e-class
    sel: list[tuple[int, int, int, Ranges]] = field(default_factory=list)  # (ref, part, dim, ranges)
    selw: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)  # (ref, part, dim, lo, hi, n)
    psum: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # (ref, part, start, end, total)
    pmax: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # (ref, part, start, end, total)
    frac: list[tuple[int, int, int, int]] = field(default_factory=list)  # (ref, part, num, den)
    # (outer, inner, perm): the class `outer` holds `(Permute inner perm)`, for an inner class that
    # is a reference value or related to one (a rank computing on a permuted layout)
    permute: list[tuple[int, int, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Facts:
        return Facts(
            classes=dict(data["classes"]),
            sel=[(a, b, d, tuple(tuple(r) for r in rs)) for a, b, d, rs in data["sel"]],  # type: ignore[misc]
            selw=[tuple(x) for x in data["selw"]],  # type: ignore[misc]
            psum=[tuple(x) for x in data["psum"]],  # type: ignore[misc]
            pmax=[tuple(x) for x in data.get("pmax", [])],  # type: ignore[misc]
            frac=[tuple(x) for x in data["frac"]],  # type: ignore[misc]
            permute=[tuple(x) for x in data.get("permute", [])],  # type: ignore[misc]
        )


@dataclass
class Saturation:
    status: str  # fixpoint | iteration-limit | time-limit | size-limit | egglog-error
    iterations: int
    seconds: float
    rows: int
    message: str = ""
    facts: Facts | None = None
    rule_matches: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return self.status == "fixpoint"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["facts"] = None if self.facts is None else self.facts.to_dict()
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Saturation:
        facts = data.get("facts")
        return Saturation(
            status=data["status"],
            iterations=data["iterations"],
            seconds=data["seconds"],
            rows=data["rows"],
            message=data.get("message", ""),
            facts=None if facts is None else Facts.from_dict(facts),
            rule_matches=data.get("rule_matches", {}),
            load_seconds=data.get("load_seconds", 0.0),
        )


_BOOKKEEPING = frozenset({statements.NAMES_TABLE})  # rows that are no part of the e-graph's terms


def prepared_egraph() -> EGraph:
    """An e-graph with the language, the rules and the statements declared: what every saturation
    starts from (0.15-0.35 s to load, so a sandbox child prepares the next one while it waits)."""
    egraph = EGraph()
    egraph.run_text(DECLARATIONS)
    egraph.run_text(rules.program_text())
    egraph.run_text(statements.declarations())
    return egraph


def saturate(
    commands: list[str], max_iterations: int, max_seconds: float, max_rows: int, prepared: EGraph | None = None
) -> Saturation:
    """Saturate one unit's commands; `prepared`: a fresh `prepared_egraph()` to start from."""
    start = time.perf_counter()
    try:
        egraph = prepared if prepared is not None else prepared_egraph()
        egraph.load(statements.compact(commands))
    except EgglogError as exc:
        return Saturation("egglog-error", 0, time.perf_counter() - start, 0, f"loading the unit: {exc}")
    loaded = time.perf_counter()
    iterations = 0
    status = "iteration-limit"
    matches: dict[str, int] = {}
    try:
        while iterations < max_iterations:
            step = min(ITERATIONS_PER_CHUNK, max_iterations - iterations)
            outcome = egraph.run_schedule(rules.schedule(step))
            iterations += step
            for name, count in outcome.matches.items():
                matches[name] = matches.get(name, 0) + count
            if not outcome.updated:
                status = "fixpoint"
                break
            if time.perf_counter() - loaded > max_seconds:
                status = "time-limit"
                break
            if egraph.total_rows(_BOOKKEEPING) > max_rows:
                status = "size-limit"
                break
    except EgglogError as exc:
        return Saturation(
            "egglog-error", iterations, time.perf_counter() - loaded, 0, str(exc), load_seconds=loaded - start
        )
    facts = read_facts(egraph)
    rows = egraph.total_rows(_BOOKKEEPING)
    return Saturation(
        status,
        iterations,
        time.perf_counter() - loaded,
        rows,
        facts=facts,
        rule_matches=matches,
        load_seconds=loaded - start,
    )


def read_facts(egraph: EGraph) -> Facts:
    functions = egraph.function_rows()
    class_ids: dict[Any, int] = {}

    def cls(value: Any) -> int:
        if value not in class_ids:
            class_ids[value] = len(class_ids)
        return class_ids[value]

    ranges = _range_decoder(egraph, functions)
    facts = Facts()
    for inputs, _ in functions["node"].rows:
        facts.classes[egraph.to_str(inputs[1])] = cls(inputs[0])
    for inputs, _ in functions["sel"].rows:
        decoded = ranges(inputs[3])
        if decoded is not None:
            facts.sel.append((cls(inputs[0]), cls(inputs[1]), egraph.to_int(inputs[2]), decoded))
    for inputs, _ in functions["selw"].rows:
        facts.selw.append((cls(inputs[0]), cls(inputs[1]), *(egraph.to_int(v) for v in inputs[2:])))  # type: ignore[arg-type]
    for inputs, _ in functions["psum"].rows:
        facts.psum.append((cls(inputs[0]), cls(inputs[1]), *(egraph.to_int(v) for v in inputs[2:])))  # type: ignore[arg-type]
    for inputs, _ in functions["pmax"].rows:
        facts.pmax.append((cls(inputs[0]), cls(inputs[1]), *(egraph.to_int(v) for v in inputs[2:])))  # type: ignore[arg-type]
    for inputs, _ in functions["frac"].rows:
        facts.frac.append((cls(inputs[0]), cls(inputs[1]), *(egraph.to_int(v) for v in inputs[2:])))  # type: ignore[arg-type]
    _read_permutes(egraph, functions["Permute"].rows, cls, facts)
    return facts


def _read_permutes(egraph: EGraph, rows: Any, cls: Any, facts: Facts) -> None:
    """The permutations of related values that classes holding a rank value hold: only those can
    relate a rank value to a reference value (the e-graph holds many more permuted terms)."""
    related = {c for name, c in facts.classes.items() if name.startswith("reference/")}
    for relation in (facts.sel, facts.selw, facts.psum, facts.pmax, facts.frac):
        related.update(row[1] for row in relation)
    ranks = {c for name, c in facts.classes.items() if not name.startswith("reference/")}
    for inputs, output in rows:
        inner, outer = cls(inputs[0]), cls(output)
        if inner in related and outer in ranks and inner != outer:
            facts.permute.append((outer, inner, egraph.to_str(inputs[1])))


def _range_decoder(egraph: EGraph, functions: dict[str, Any]) -> Any:
    """Decode a range-list e-class into its shortest evaluated form, or None if unevaluated."""
    conses: dict[Any, list[tuple[int, int, Any]]] = {}
    for inputs, output in functions["RCons"].rows:
        conses.setdefault(output, []).append((egraph.to_int(inputs[0]), egraph.to_int(inputs[1]), inputs[2]))
    nils = {output for _, output in functions["RNil"].rows}
    memo: dict[Any, Ranges | None] = {}

    def decode(value: Any, depth: int = 0) -> Ranges | None:
        if value in memo:
            return memo[value]
        if value in nils:
            return ()
        if depth > 256:
            return None
        best: Ranges | None = None
        for start, end, tail in conses.get(value, []):
            rest = decode(tail, depth + 1)
            if rest is None:
                continue
            candidate = ((start, end), *rest)
            if best is None or len(candidate) < len(best):
                best = candidate
        memo[value] = best
        return best

    return decode
