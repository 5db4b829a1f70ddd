"""What a verification reports: plain, JSON-able data shared by the CLI, JSON/SARIF output and
the language server. No torch, no egglog, no LSP types."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

# What a world size (and a check) can end as, decided by evidence:
#   verified      proven equal
#   discrepancy   a difference is shown: real numbers differ, a rank fails where the reference
#                 does not, or the ranks' collective calls are proven not to pair up
#   unproven      neither proven equal nor a shown difference (a gap in the rules, or a bug the
#                 numeric witness could not expose); the report names the first value without a
#                 relation, its line, and what the numbers said
#   inconclusive  a bound was hit or an operation is not supported
#   error         the declaration or the user's code failed before anything was verified
VERDICTS = ("verified", "discrepancy", "unproven", "inconclusive", "error")
# The order a check (or a run of checks) takes its verdict from its world sizes: the first present.
VERDICT_PRECEDENCE = ("error", "discrepancy", "inconclusive", "unproven")

# Stable discrepancy kinds (diagnostic codes); README anchors use the same names.
DISCREPANCY_KINDS = {
    "missing-reduction": "a partial sum is used as if it were the full value (an all-reduce is missing)",
    "partial-sum-into-nonlinear": "a partial sum flows into an operation that is not linear",
    "duplicate-reduction": "a value that is already complete is all-reduced again",
    "wrong-collective-op": "an all-reduce combines the ranks' parts with the wrong operation (AVG for partial sums)",
    "bias-before-reduction": "a replicated value is added on every rank before the all-reduce",
    "wrong-scaling": "a share of a value is scaled by the wrong factor",
    "wrong-shard": "a rank holds a different slice than its partners need",
    "shard-order": "shards are concatenated in the wrong order",
    "wrong-layout": "a tensor is gathered, reshaped or concatenated along the wrong dimension",
    "unrelated-parameter": "a parameter is not derived from the reference weights",
    "collective-mismatch": "ranks disagree on their collective calls",
    "wrong-handover": "a pipeline stage hands the next stage less than it needs to continue",
    "missing-layers": "layers of the reference that no rank runs (a split of the layers over stages leaves some out)",
    "missing-gradient": "a rank computes no gradient for a parameter the reference trains",
    "scaled-gradient": "a gradient is the reference's times a constant (averaged with the wrong count)",
    "wrong-constant": "an operation uses another number than the reference's (a scale from the local sizes)",
    "wrong-group": "a collective runs over ranks that do not hold the parts it combines (the wrong process group)",
    "skipped-operation": "a rank uses or returns the input of a reference operation in its place (a bias left out)",
    "not-equivalent": "a value matches nothing the reference computes",
}


@dataclass(frozen=True)
class Site:
    file: str
    line: int
    column: int | None = None  # 1-based, like editors show
    end_line: int | None = None
    end_column: int | None = None  # 1-based, exclusive
    code: str = ""
    function: str = ""
    note: str = ""  # what happens here, for related locations

    def short(self) -> str:
        import os

        col = f":{self.column}" if self.column else ""
        return f"{os.path.basename(self.file)}:{self.line}{col}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any] | None) -> Site | None:
        return None if data is None else Site(**data)


@dataclass
class Discrepancy:
    kind: str
    message: str
    primary: Site | None  # where the fix belongs
    reference: Site | None = None  # the reference computation at that point
    related: list[Site] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    reference_node: str = ""
    parallel_nodes: list[str] = field(default_factory=list)
    expected: str = ""  # the relation that was expected
    found: str = ""  # what each rank holds instead
    suggestion: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    # The numeric witness: "confirmed" (real numbers differ, with the errors), "agree" (every trial
    # agreed: see "trials"), or "not-run" with the reason.
    witness: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.id:
            anchor = self.primary.short() if self.primary else ""
            self.id = hashlib.sha256(f"{self.kind}|{anchor}|{self.reference_node}".encode()).hexdigest()[:12]

    @property
    def primary_role(self) -> str:
        """What the primary site is: where the fix belongs, or, for a difference only real numbers
        show (`details["unpinned"]`), the first operation the rules do not follow."""
        if self.details.get("unpinned"):
            return "the first operation the rules do not follow"
        return "where the fix belongs"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Discrepancy:
        values = dict(data)
        values["primary"] = Site.from_dict(values.get("primary"))
        values["reference"] = Site.from_dict(values.get("reference"))
        values["related"] = [Site(**r) for r in values.get("related", [])]
        return Discrepancy(**values)


@dataclass
class Unsupported:
    """Why a result is inconclusive."""

    reason: str  # "unsupported-op" | "bound" | "capture"
    message: str
    op: str = ""
    site: Site | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Unsupported:
        return Unsupported(data["reason"], data["message"], data.get("op", ""), Site.from_dict(data.get("site")))


@dataclass
class OutputRelation:
    index: int
    relation: str  # replicated | sharded | partial | gradient (as the parameter is held) | none
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WorldSizeResult:
    world_size: int
    verdict: str
    summary: str = ""
    outputs: list[OutputRelation] = field(default_factory=list)
    discrepancies: list[Discrepancy] = field(default_factory=list)  # shown differences only
    # Findings that are not shown (verdict "unproven"): the first value without a proven relation,
    # its site, what was proven, and the numeric witness that found no difference (or why none ran).
    # `kind` is what the localizer suspected; `message` says what is known, `details["suspected"]`
    # the localizer's own wording.
    unproven: list[Discrepancy] = field(default_factory=list)
    inconclusive: list[Unsupported] = field(default_factory=list)
    error: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the verdict takes as given (dropout as the identity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "verdict": self.verdict,
            "summary": self.summary,
            "outputs": [o.to_dict() for o in self.outputs],
            "discrepancies": [d.to_dict() for d in self.discrepancies],
            "unproven": [d.to_dict() for d in self.unproven],
            "inconclusive": [u.to_dict() for u in self.inconclusive],
            "error": self.error,
            "seconds": self.seconds,
            "stats": self.stats,
            "notes": self.notes,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> WorldSizeResult:
        return WorldSizeResult(
            world_size=data["world_size"],
            verdict=data["verdict"],
            summary=data.get("summary", ""),
            outputs=[OutputRelation(**o) for o in data.get("outputs", [])],
            discrepancies=[Discrepancy.from_dict(d) for d in data.get("discrepancies", [])],
            unproven=[Discrepancy.from_dict(d) for d in data.get("unproven", [])],
            inconclusive=[Unsupported.from_dict(u) for u in data.get("inconclusive", [])],
            error=data.get("error"),
            seconds=data.get("seconds", {}),
            stats=data.get("stats", {}),
            notes=data.get("notes", []),
        )


@dataclass
class CheckResult:
    name: str
    results: list[WorldSizeResult] = field(default_factory=list)
    error: dict[str, Any] | None = None  # a failure before any world size ran (import, config)
    dependencies: list[str] = field(default_factory=list)  # files that take part in the check

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "error"
        verdicts = {r.verdict for r in self.results}
        for verdict in VERDICT_PRECEDENCE:
            if verdict in verdicts:
                return verdict
        return "verified" if self.results else "error"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "error": self.error,
            "world_sizes": [r.to_dict() for r in self.results],
            "dependencies": self.dependencies,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> CheckResult:
        return CheckResult(
            name=data["name"],
            results=[WorldSizeResult.from_dict(r) for r in data.get("world_sizes", [])],
            error=data.get("error"),
            dependencies=list(data.get("dependencies", [])),
        )


# Exit codes of `shardproof verify`, by the verdicts of the checks run.
EXIT_CODES = {"verified": 0, "discrepancy": 1, "inconclusive": 2, "error": 2, "unproven": 3}
# `--fail-on LEVEL`: the verdicts that fail a run at each level (an error always fails it).
FAIL_ON = {
    "discrepancy": ("discrepancy",),
    "unproven": ("discrepancy", "unproven"),
    "inconclusive": ("discrepancy", "unproven", "inconclusive"),
}


def exit_code(checks: list[CheckResult], fail_on: str = "inconclusive") -> int:
    """0 when everything verified, 1 on a discrepancy, 2 when inconclusive or on error, 3 when
    unproven. A discrepancy is the most specific news, so it wins over every other verdict; an
    error or an inconclusive world size wins over an unproven one. With `fail_on`, verdicts below
    that level (see FAIL_ON) give 0; an error always fails."""
    verdicts = {r.verdict for c in checks for r in c.results} | {c.verdict for c in checks}
    failing = set(FAIL_ON[fail_on]) | {"error"}
    for verdict in ("discrepancy", "error", "inconclusive", "unproven"):
        if verdict in verdicts and verdict in failing:
            return EXIT_CODES[verdict]
    return 0
