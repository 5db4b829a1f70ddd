"""From "not proven" to "this line, this mistake": the dispatcher of the localizer's detectors.

After saturation every reference value either has relations to each rank's values or not. A
reference value is *broken* on a rank when it has none and every path from it to a failing
output runs through values that have none either; the topologically first broken value is the
point where the parallel program stops computing the reference's function. A value another rank
computes by design (an expert another rank owns: that rank relates it and combines it, and this
rank's operation in its place computes another reference value) is not broken on this rank
(`Context._computed_elsewhere`). Detectors then ask
why, using only the proven relations, the rank graphs and the parameter provenance. They are
tried in this order, and the first that applies gives the report:

1. program detectors, on the whole program:
   collective-mismatch   ranks disagree on their collective calls (nothing else can be compared)
   missing-layers        a pipeline's stages skip or repeat the reference's layers (stages.py)
   missing-gradient      a rank computes no gradient for a parameter the reference trains
   scaled-gradient       a gradient is the reference's times a constant
   wrong-collective-op   an all-reduce or reduce-scatter combines proven partial sums (maybe
                         rearranged alike on every rank) with AVG / MAX (or partial maxima with
                         SUM): the op is what to change
   term-coverage         an all-reduce of the ranks' sums of terms (experts) that does not add
                         every term of the reference's sum exactly once
   unpacked-buffer       values concatenated, reduced as one buffer, and sliced back out across
                         two of them (a coalesced all-reduce unpacked at the wrong offset)
2. duplicate-reduction   an all-reduce of a value already complete, when it is no later than the
                         first broken value (it is what breaks it)
3. value detectors, at the first broken value, on the first rank where one names a line:
   stage-handover        a pipeline stage sends one input of the next step instead of its result
   partial-misuse        a partial sum used before its reduction (missing-reduction, a bias added
                         before it, a share with the wrong fraction, partial sums that do not tile
                         the all-reduce, rearranged or reduced twice)
   embedding-mask        a vocabulary-parallel embedding's mask or shift does not match its rows
   target-pick-mask      a vocabulary-parallel loss's target pick does not match its classes
   skipped-operation     the rank returns an input of the reference's last operation as the
                         reference computes it (a residual add or a bias left out)
   wrong-constant        the rank op playing the value's part has related inputs but another
                         number (a scale, a divisor): reported where the number is assigned
   mismatch              the rank op playing the value's part has an input that is unrelated or
                         does not fit (wrong-shard, shard-order, wrong-layout, unrelated-parameter)
   not-equivalent        nothing on the rank relates to the value (the last resort)
4. output-mismatch       no value is broken but an output is (wrong shape, order, unreduced)

Unknown ops on sharded inputs make the result inconclusive (`Unsupported`) instead of a discrepancy.
A report at a user line that called into a library also shows the library's line, and a report whose
culprit's layout a DTensor plan decided is moved to the plan entry (plans.py).
"""

from __future__ import annotations

from ..graph.model import Node, Placeholder
from ..results import Discrepancy, Unsupported
from .blame import blocked_tiling
from .context import Context
from .detectors import ProgramDetector, ValueDetector
from .detectors.collective_mismatch import collective_mismatch
from .detectors.collective_op import wrong_collective_op
from .detectors.duplicate_reduction import duplicate_reduction
from .detectors.embedding_mask import embedding_mask
from .detectors.mismatch import mismatch
from .detectors.missing_gradient import missing_gradient
from .detectors.not_equivalent import not_equivalent
from .detectors.output_mismatch import output_mismatch
from .detectors.partial_misuse import partial_misuse
from .detectors.scaled_gradient import scaled_gradient
from .detectors.skipped_operation import skipped_operation
from .detectors.stage_handover import stage_handover
from .detectors.target_pick_mask import target_pick_mask
from .detectors.term_coverage import term_coverage
from .detectors.unpacked_buffer import unpacked_buffer
from .detectors.wrong_constant import wrong_constant
from .evidence import Evidence
from .number_origin import relocated
from .stages import missing_layers
from .stray_operand import cut_otherwise, misapplied
from .wording import describe_op

PROGRAM_DETECTORS = [
    ProgramDetector(
        "collective-mismatch",
        "the encoder's collective issues",
        lambda ctx, _: collective_mismatch(ctx, ctx.ev.issues[0]) if ctx.ev.issues else None,
    ),
    ProgramDetector(
        "missing-layers",
        "the stages' block placements",
        lambda ctx, _: missing_layers(ctx.reference, ctx.ev.ranks, ctx.ev.rank_values),
    ),
    ProgramDetector("missing-gradient", "gradient roles and cuts", missing_gradient),
    ProgramDetector("scaled-gradient", "factors carried outside values", scaled_gradient),
    ProgramDetector(
        "wrong-collective-op", "the relations of reducing collectives' inputs and outputs", wrong_collective_op
    ),
    ProgramDetector("term-coverage", "the terms of the sums all-reduced and of the reference's sums", term_coverage),
    ProgramDetector("unpacked-buffer", "slices of reduced concatenations and the pieces' sizes", unpacked_buffer),
]
VALUE_DETECTORS = [
    ValueDetector("stage-handover", "point-to-point sends", stage_handover),
    ValueDetector("partial-misuse", "partial sums among the value's inputs and their consumers", partial_misuse),
    ValueDetector("embedding-mask", "an embedding's weight selection and its ids' mask", embedding_mask),
    ValueDetector("target-pick-mask", "a target pick's logits selection and mask", target_pick_mask),
    ValueDetector("skipped-operation", "the rank's outputs and their relations", skipped_operation),
    ValueDetector("wrong-constant", "the literal numbers of the rank op playing the value's part", wrong_constant),
    ValueDetector("mismatch", "the input relations of the rank op playing the value's part", mismatch),
]


def explain(evidence: Evidence, failing_outputs: list[int]) -> Discrepancy | Unsupported:
    ctx = Context(evidence)
    found = _explain(ctx, failing_outputs)
    if isinstance(found, Discrepancy) and "number_origin" not in found.details:
        found = relocated(found, evidence.rank_numbers)
    return ctx.with_plan_context(ctx.with_library_context(found))


def _explain(ctx: Context, failing_outputs: list[int]) -> Discrepancy | Unsupported:
    for program_detector in PROGRAM_DETECTORS:
        found = program_detector.find(ctx, failing_outputs)
        if found is not None:
            return found
    duplicate = duplicate_reduction(ctx)
    broken: list[tuple[int, int, str]] = []
    failing_ids = [ctx.reference.outputs[i] for i in failing_outputs]
    compared = ctx.ev.outputs_of if ctx.ev.outputs_of is not None else range(len(ctx.ev.ranks))
    for rank in compared:
        first = ctx.first_broken(rank, failing_ids)
        if first is not None:
            broken.append((ctx.topo[first], rank, first))
    if duplicate is not None and (not broken or duplicate.details.get("topo", 1 << 30) <= min(broken)[0] + 1):
        return duplicate
    if not broken:
        # every failing output, of the reference's shape, is related on every rank through what
        # other ranks sent it (a gathered piece): the value a rank alone fails to compute, if
        # one, is the mistake (an output of another shape is a layout to fix: output_mismatch)
        for rank in compared if _outputs_shaped_alike(ctx, failing_outputs) else []:
            lone = ctx.first_broken_alone(rank, failing_ids)
            if lone is not None:
                found = _diagnose(ctx, ctx.ref_nodes[lone], rank, [rank])
                if isinstance(found, Unsupported) or found.primary is not None:
                    return found
        return output_mismatch(ctx, failing_outputs)
    # The earliest broken value, on the first rank where a detector can name a location; ranks
    # that skip the computation entirely (a full slice is no node at all) have nothing to show.
    fallback: Discrepancy | Unsupported | None = None
    first: tuple[Node, int] | None = None
    for _, rank, node_id in sorted(broken):
        ranks = sorted({r for _, r, n in broken if n == node_id})
        found = _diagnose(ctx, ctx.ref_nodes[node_id], rank, ranks)
        if isinstance(found, Unsupported) or (found.primary is not None):
            return found
        fallback = fallback or found
        first = first or (ctx.ref_nodes[node_id], rank)
    assert fallback is not None and first is not None
    if isinstance(fallback, Discrepancy):
        # no detector names a line: the reference's operation applied to another operand is where
        # the stray value is made (stray_operand.py)
        stray = misapplied(ctx, *first)
        if stray is not None:
            return _misapplied(ctx, fallback, first[0], first[1], stray)
        # else the first of the rank's values that reads what is related to the broken value's
        # inputs and is not related itself is where its computation departs from the
        # reference's (an exchange, a regrouping)
        departure = ctx.departure(*first)
        if departure is None:
            # the rank reads the broken value's inputs only on its way to values it shares with the
            # reference (a mask the reference makes of the targets, which the rank never applies):
            # it departs where the reference would use the value (its consumers and theirs, in
            # order: a count the reference makes of the mask, which the rank replaces by a
            # constant where the count is used)
            later = ctx.consumers_in_reference(first[0].id, transitively=True)
            for i, consumer in enumerate(later):
                departure = ctx.departure(consumer, first[1], ahead={n.id for n in later[i:]})
                if departure is not None:
                    break
        cut = cut_otherwise(ctx, first[0], first[1], departure) if departure is not None else None
        if cut is not None:
            # what the departing operation reads is cut from the broken value's source, otherwise
            fallback.primary = ctx.rank_site(cut, "the rank's cut of a value the reference cuts otherwise")
            fallback.parallel_nodes = [f"rank{first[1]}/{cut.id}"]
            source, taken = ctx.ref_value_name(first[0].inputs[0]), describe_op(first[0])
            at = ctx.ref_site(first[0])
            taken += f" at {at.short()}" if at is not None else ""
            fallback.message = (
                f"rank {first[1]} cuts {source} otherwise than the reference's {taken}, and uses its cut where "
                "the reference uses that one"
            )
            fallback.expected = f"the part of {source} the reference's {taken} holds"
            fallback.found = "another part of it (the rank's cut)"
        elif departure is not None:
            fallback.primary = ctx.rank_site(departure, "the rank's computation departs from the reference's here")
            fallback.parallel_nodes = fallback.parallel_nodes or [f"rank{first[1]}/{departure.id}"]
            if ctx.other_op_on_same_values(first[0], first[1], departure):
                ref_op, rank_op = describe_op(first[0]), describe_op(departure)
                fallback.message = (
                    f"rank {first[1]} computes {rank_op} where the reference computes {ref_op}, on matching inputs"
                )
                fallback.expected, fallback.found = ref_op, rank_op
    return fallback


def _misapplied(ctx: Context, found: Discrepancy, ref_node: Node, rank: int, stray: Node) -> Discrepancy:
    """`found` at the rank's `stray` operation: the reference's operation on another operand."""
    position, ref_value, value = next(
        (k, ref_value, value)
        for k, (ref_value, value) in enumerate(zip(ref_node.inputs, stray.inputs, strict=True))
        if not ctx.relations_between(ref_value, rank, value)
    )
    held = ctx.index.relations_of_rank_value(rank, value)
    read, expected = ctx.ref_value_names(held[0][1][0], ref_value)
    op = describe_op(ref_node)
    found.primary = ctx.rank_site(stray, f"the {op} applied to another value")
    found.parallel_nodes = [f"rank{rank}/{stray.id}"]
    found.details["culprit"] = f"rank{rank}/{stray.id}"
    found.message = (
        f"rank {rank} applies the {op} to {read} (input {position}) where the reference applies it to {expected}"
    )
    found.expected, found.found = f"the {op} of {expected}", f"the {op} of {read}"
    return found


def _outputs_shaped_alike(ctx: Context, failing_outputs: list[int]) -> bool:
    """Whether every rank returns each failing output in the reference output's shape."""
    for index in failing_outputs:
        if index >= len(ctx.reference.outputs):
            return False
        shape = ctx.reference.meta_of(ctx.reference.outputs[index]).shape
        for graph in ctx.ev.ranks:
            if index >= len(graph.outputs) or graph.meta_of(graph.outputs[index]).shape != shape:
                return False
    return True


def _diagnose(ctx: Context, node: Node, rank: int, ranks: list[int]) -> Discrepancy | Unsupported:
    found: Discrepancy | Unsupported | None = None
    for detector in VALUE_DETECTORS:
        found = detector.find(ctx, node, rank)
        if found is not None:
            break
    if found is None:
        found = not_equivalent(ctx, node, rank, ranks)
    if isinstance(found, Discrepancy):
        found.ranks = found.ranks or ranks
        found.details.setdefault("neighbourhood", ctx.neighbourhood(node, rank, found))
    return found


__all__ = ["Evidence", "Placeholder", "blocked_tiling", "explain"]
