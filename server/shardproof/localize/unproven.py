"""A finding that is not shown, reported as what it is: not proven.

The localizer names the first reference value that no rank value is proven to relate to, and
guesses why (a missing all-reduce, a wrong shard, ...). Only real numbers that differ, or a proof
that the ranks' collective calls cannot pair up, show that guess to be a mistake. When neither
does, the report says what is known instead: how far the proof went (how many of the reference's
values are related on every rank, and how the first unrelated value's inputs relate), where the
first value without a relation is computed, what the numbers said, and what the user can do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..graph.model import Graph
from ..results import Discrepancy, Unsupported, WorldSizeResult
from ..verify.relations_found import RelationIndex
from .wording import describe_op

# Kinds that a proof shows without numbers: ranks whose collective calls cannot pair up.
SHOWN_BY_PROOF = ("collective-mismatch",)


def shown(finding: Discrepancy) -> bool:
    """Whether `finding` is a shown difference: proven structurally, or confirmed by numbers."""
    return finding.kind in SHOWN_BY_PROOF or (finding.witness or {}).get("status") == "confirmed"


def settle(
    result: WorldSizeResult,
    finding: Discrepancy | Unsupported,
    reference: Graph,
    index: RelationIndex,
    compared: list[int],
    witness: Callable[[Discrepancy], dict[str, object]],
    note: str = "",
) -> WorldSizeResult:
    """The verdict a localized finding gives `result`: inconclusive where the rules cannot follow
    the program, a discrepancy when its witness (or a proof) shows it, else unproven (`note`: what
    the report adds on where and how it was found)."""
    if isinstance(finding, Unsupported):
        differing = _numbers_past(finding, compared, witness)
        if differing is not None:  # the rules stop, but real numbers show the outputs differ
            result.verdict = "discrepancy"
            result.discrepancies.append(differing)
            result.summary = differing.message
            return result
        result.verdict = "inconclusive"
        result.inconclusive.append(finding)
        result.summary = finding.message
        return result
    finding.witness = witness(finding)
    if shown(finding):
        result.verdict = "discrepancy"
        result.discrepancies.append(finding)
        result.summary = finding.message
        return result
    unproven = as_unproven(finding, reference, index, compared)
    unproven.message += note
    result.verdict = "unproven"
    result.unproven.append(unproven)
    result.summary = unproven.message
    return result


def _numbers_past(
    gap: Unsupported, compared: list[int], witness: Callable[[Discrepancy], dict[str, object]]
) -> Discrepancy | None:
    """Where the rules cannot follow the program (`gap`), the outputs compared on real numbers: a
    discrepancy when they differ, shown by the numbers alone (the line to change is not pinned:
    the report names the first operation the rules do not follow). None when they agree or the
    numbers could not be run."""
    if gap.reason != "unsupported-op":
        return None
    found = Discrepancy(
        kind="not-equivalent",
        message=(
            "the outputs differ from the reference's on real numbers; where the mistake is was not found, "
            f"because {gap.message}"
        ),
        primary=gap.site,
        ranks=list(compared),
        expected="every compared rank's outputs equal the reference's",
        found="outputs that differ on real numbers (the witness)",
        suggestion=(
            f"look for the mistake in the computation up to and past the {gap.op} at this line; report the "
            "pattern so a rule can cover it and pin the line"
        ),
    )
    found.details["unpinned"] = True
    found.witness = witness(found)
    return found if shown(found) else None


def proven_extent(reference: Graph, index: RelationIndex, ranks: list[int]) -> tuple[int, int]:
    """(values related on every compared rank, values) of the reference's computed values."""
    values = [node.id for node in reference.nodes]
    related = sum(all(index.related(value, rank) for rank in ranks) for value in values)
    return related, len(values)


def as_unproven(finding: Discrepancy, reference: Graph, index: RelationIndex | None, ranks: list[int]) -> Discrepancy:
    """`finding` restated as not proven: same site and suspected kind, a message that claims only
    what was shown, and what to do about it."""
    nodes = reference.node_map()
    node = nodes.get(finding.reference_node)
    what = f"the reference's {describe_op(node)}" if node is not None else "an output of the reference"
    where = f" ({finding.reference.short()})" if finding.reference is not None else ""
    on = ", ".join(str(r) for r in (finding.ranks or ranks))
    parts = [f"not proven: {what}{where} has no proven counterpart on rank{'s' if ',' in on else ''} {on}"]
    if index is not None:
        related, total = proven_extent(reference, index, ranks)
        proven = f"{related} of the reference's {total} values are proven related on every rank"
        inputs = _input_relations(node.inputs if node is not None else (), reference, index, ranks[0] if ranks else 0)
        parts.append(f"{proven}, and its inputs on rank {ranks[0] if ranks else 0} are {inputs}" if inputs else proven)
    witness = finding.witness or {}
    if witness.get("status") == "agree":
        trials = len(witness.get("trials") or [None])
        parts.append(f"the numbers agree on {trials} trial{'' if trials == 1 else 's'}")
    elif witness:
        parts.append(f"no numeric witness: {witness.get('reason', 'not run')}")
    details = dict(finding.details)
    details["suspected"] = finding.message
    details["suspected_fix"] = finding.suggestion
    return replace(
        finding,
        message="; ".join(parts),
        suggestion=(
            "if the code is right, declare what shardproof cannot infer (a parameter's relation under "
            "[tool.shardproof.check.parameters]) or report the pattern at this line so a rule can cover it; "
            "if it may be wrong, the suspected mistake is worth a look"
        ),
        details=details,
    )


def _input_relations(inputs: tuple[str, ...], reference: Graph, index: RelationIndex, rank: int) -> str:
    """How rank `rank` holds each input of the first unrelated value: "input 0: the full value
    (replicated); input 1: no relation"."""
    described = []
    for position, value in enumerate(inputs):
        relations = index.relations(value, rank)
        try:
            shape: tuple[int, ...] | None = reference.meta_of(value).shape
        except KeyError:
            shape = None
        held = relations[0][0].describe(shape) if relations else "no relation"
        described.append(f"{held} (input {position})")
    return "; ".join(described[:4])
