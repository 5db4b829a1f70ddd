"""Decide, from the proven relations, how each rank's outputs relate to the reference outputs."""

from __future__ import annotations

from ..graph.model import Graph
from ..results import OutputRelation
from .relations_found import RelationIndex

ACCEPTED = {
    "replicated": {"replicated"},
    "sharded": {"replicated", "sharded"},
    "partial": {"replicated", "sharded", "partial"},
}


def output_relations(
    index: RelationIndex, reference: Graph, ranks: list[Graph], expectation: str
) -> tuple[list[OutputRelation], list[int]]:
    """Relations found for every output, and the indices of outputs that fail the expectation."""
    found: list[OutputRelation] = []
    failing: list[int] = []
    last_rank = expectation == "last-rank"
    if last_rank:
        # a pipeline: the last stage returns the reference's outputs, the others what they hand on
        ranks, expectation = ranks[-1:], "replicated"
    accepted = ACCEPTED.get(expectation, ACCEPTED["sharded"])
    for i, ref_value in enumerate(reference.outputs):
        relation = _relation(index, ref_value, ranks, i)
        if last_rank and relation.relation == "replicated":
            relation.description = f"the last rank (rank {ranks[0].rank}) returns the full reference output"
        found.append(relation)
        if relation.relation not in accepted:
            failing.append(i)
    if any(len(g.outputs) != len(reference.outputs) for g in ranks):
        failing.extend(range(len(reference.outputs), max(len(g.outputs) for g in ranks)))
    return found, failing


def _relation(index: RelationIndex, ref_value: str, ranks: list[Graph], i: int) -> OutputRelation:
    if any(i >= len(g.outputs) for g in ranks):
        return OutputRelation(i, "none", "some ranks do not return this output")
    shape = reference_shape(index, ref_value)
    per_rank = []
    for position, graph in enumerate(ranks):
        value = graph.outputs[i]
        rank = graph.rank if graph.rank is not None else position
        rels = [rel for rel, values in index.relations(ref_value, rank) if value in values]
        per_rank.append(rels)
    if all(any(r.kind == "equal" for r in rels) for rels in per_rank):
        return OutputRelation(i, "replicated", "every rank returns the full reference output")
    sels = [next((r for r in rels if r.kind == "sel" and len(r.ranges) == 1), None) for rels in per_rank]
    if all(s is not None for s in sels) and len({s.dim for s in sels}) == 1:  # type: ignore[union-attr]
        spans = [s.ranges[0] for s in sels]  # type: ignore[union-attr]
        position = 0
        for start, end in spans:
            if start != position:
                break
            position = end
        else:
            size = shape[sels[0].dim] if shape else position  # type: ignore[union-attr,index]
            if position == size:
                dim = sels[0].dim  # type: ignore[union-attr]
                dim_text = f"dim {len(shape) + dim}" if shape else f"dim {dim}"
                return OutputRelation(
                    i, "sharded", f"rank r returns block r of {dim_text}: " + ", ".join(f"[{s}:{e}]" for s, e in spans)
                )
    psums = [next((r for r in rels if r.kind == "psum"), None) for rels in per_rank]
    if all(p is not None for p in psums):
        spans = sorted((p.start, p.end) for p in psums)  # type: ignore[union-attr]
        position = 0
        for start, end in spans:
            if start != position:
                break
            position = end
        else:
            if position == psums[0].total:  # type: ignore[union-attr]
                return OutputRelation(i, "partial", "ranks return partial sums; their sum is the reference output")
    return OutputRelation(i, "none", "no relation to the reference output was proven")


def reference_shape(index: RelationIndex, ref_value: str) -> tuple[int, ...] | None:
    try:
        return index.reference.meta_of(ref_value).shape
    except KeyError:
        return None
