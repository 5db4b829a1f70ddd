"""Decide, from the proven relations, how each rank's outputs relate to the reference outputs."""

from __future__ import annotations

from ..graph.model import Graph
from ..relations.expr import norm_dim
from ..results import OutputRelation
from .relations_found import Relation, RelationIndex

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
    roles = reference.gradient_roles
    for i, ref_value in enumerate(reference.outputs):
        role = roles[i] if i < len(roles) else None
        if role is not None:
            gradient = _gradient_relation(index, ref_value, ranks, i, role.parameter)
            found.append(gradient)
            if gradient.relation != "gradient":
                failing.append(i)
            continue
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
    per_rank = [_output_relations(index, ref_value, graph, position, i)[1] for position, graph in enumerate(ranks)]
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


def _gradient_relation(
    index: RelationIndex, ref_value: str, ranks: list[Graph], i: int, parameter: str
) -> OutputRelation:
    """A gradient output: every rank must return the reference gradient of `parameter` whole where
    the rank holds the whole parameter, or the same block where it holds a block."""
    shape = reference_shape(index, ref_value)
    blocks = []
    for position, graph in enumerate(ranks):
        rank = graph.rank if graph.rank is not None else position
        role = graph.gradient_roles[i] if i < len(graph.gradient_roles) else None
        if role is None or i >= len(graph.outputs) or role.parameter != parameter:
            return OutputRelation(i, "none", f"rank {rank} returns no gradient for `{parameter}`")
        if role.absent:
            return OutputRelation(i, "none", f"rank {rank} computes no gradient for `{role.rank_parameter}`")
        _, rels = _output_relations(index, ref_value, graph, position, i)
        if role.dim is None:
            if not any(r.kind == "equal" for r in rels):
                return OutputRelation(
                    i,
                    "none",
                    f"rank {rank}'s gradient of `{role.rank_parameter}` is not the full gradient of "
                    f"`{parameter}`" + _found(rels),
                )
            blocks.append("whole")
            continue
        if not any(
            r.kind == "sel"
            and len(r.ranges) == 1
            and r.ranges[0] == (role.start, role.end)
            and _same_dim(r.dim, role.dim, shape)
            for r in rels
        ):
            return OutputRelation(
                i,
                "none",
                f"rank {rank}'s gradient of `{role.rank_parameter}` is not block [{role.start}:{role.end}] "
                f"of the gradient of `{parameter}`" + _found(rels),
            )
        blocks.append(f"[{role.start}:{role.end}]")
    if all(b == "whole" for b in blocks):
        text = f"gradient of `{parameter}`: every rank holds the full reference gradient"
    else:
        text = f"gradient of `{parameter}`: rank r holds the block of the parameter it holds: " + ", ".join(blocks)
    return OutputRelation(i, "gradient", text)


def _output_relations(
    index: RelationIndex, ref_value: str, graph: Graph, position: int, i: int
) -> tuple[int, list[Relation]]:
    """A rank's number and how its output `i` relates to the reference value `ref_value`: never
    through a permutation (a permuted partial sum is a partial sum of another value's layout; the
    localizer reads those, an output must be the reference's own layout)."""
    rank = graph.rank if graph.rank is not None else position
    value = graph.outputs[i]
    return rank, [rel for rel, values in index.relations(ref_value, rank) if value in values and not rel.perm]


def _same_dim(found: int, expected: int, shape: tuple[int, ...] | None) -> bool:
    if not shape:
        return found == expected
    return norm_dim(found, len(shape)) == norm_dim(expected, len(shape))


def _found(rels: list[Relation]) -> str:
    kinds = sorted({r.kind for r in rels})
    if "psum" in kinds:
        return " (it is a partial sum: the ranks' gradients add up to it, so a reduction is missing)"
    if "pmax" in kinds:
        return " (it is a partial maximum)"
    return ""


def reference_shape(index: RelationIndex, ref_value: str) -> tuple[int, ...] | None:
    try:
        return index.reference.meta_of(ref_value).shape
    except KeyError:
        return None
