"""A model verified block by block and not proven, localized in the unit that failed, when the
model is too large to run with real numbers.

`pipeline.verify_memoized` proves a model one template (distinct block) at a time plus its
skeleton; what it cannot prove it leaves to the plain run, which traces and saturates every layer
of every program at once and localizes in the whole. For a model beyond the numeric witness's
size (`witness.numeric.MAX_PARAMETER_ELEMENTS` parameter elements) that run cannot end in a
discrepancy on the full configuration (no numbers can show one there), and it is the run that
grows with the depth (the 405B shape: 126 layers in 9 programs, more than fifteen minutes). This
module answers from the unit that failed instead, in the time of one block:

- **a template not proven**: the skeleton is saturated again with that template's calls made an
  operation of each rank's own, with no law (nothing the template was to guarantee is assumed).
  When it proves that the template's first call receives, on every rank, its inputs related as
  the template's proof assumed (equal, or the rank's block), that call's failure is the template's
  failure on the inputs it really receives: the template is saturated whole and localized, its
  values named as that instance's;
- **the skeleton not proven** (every template proven): the skeleton is saturated with the
  templates' laws and localized; its block calls are operations that the laws relate.

The finding then gets the numeric witness as in the plain run (which still runs a declared quick
configuration): a difference the numbers show is a `discrepancy`; anything else is `unproven` at
the finding's line, saying that the plain run was not attempted. What the plain run could still
have found and this cannot: a proof through the whole model of what no block proves alone (a
partial sum handed across a block's boundary). `--no-memoize` runs the plain way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .localize.diagnose import Evidence, explain
from .localize.unproven import settle
from .results import Discrepancy, WorldSizeResult
from .verify import block_contracts
from .verify.relations_found import RelationIndex
from .verify.verdict import output_relations

if TYPE_CHECKING:
    from .capture.memoized import MemoizedCapture, TemplateUnit
    from .config import Check, Project
    from .graph.model import Graph
    from .relations.expr import Expr
    from .units import Unit, UnitProof

ProveFn = Callable[[list["Unit"]], list["UnitProof"]]


@dataclass
class FailedRun:
    """The memoized run that did not prove its model, as localizing it needs it: what it captured,
    the check, how to prove units, and the timings and statistics its result reports."""

    captured: MemoizedCapture
    check: Check
    project: Project
    world_size: int
    prove: ProveFn
    seconds: dict[str, float]
    stats: dict[str, object]


def too_large_for_numbers(captured: MemoizedCapture) -> int | None:
    """The reference's parameter elements when the numeric witness refuses a model that size on
    its full configuration, else None (the plain run can then still show a difference)."""
    from .witness.numeric import MAX_PARAMETER_ELEMENTS

    def parameters(graph: Graph) -> int:
        return sum(math.prod(p.meta.shape) for p in graph.placeholders if p.kind == "parameter")

    total = parameters(captured.reference.skeleton)
    total += sum(parameters(unit.reference) * len(unit.instances) for unit in captured.units)
    return total if total > MAX_PARAMETER_ELEMENTS else None


def localize_template(run: FailedRun, failed: TemplateUnit) -> WorldSizeResult | None:
    """The failed template localized at its first instance (see the module docstring); None when
    the skeleton does not prove that instance's inputs related as the template assumed."""
    from .capture.blocks import parse_key
    from .units import Unit

    captured = run.captured

    contracts = {contract.rank: contract for contract in failed.contracts}
    skeletons, laws = block_contracts.skeletons_and_laws(captured.ranks, captured.units, failed.template)
    reference_calls = block_contracts.calls_of(captured.reference.skeleton, failed.template)
    if not reference_calls:
        return None
    first = reference_calls[0]
    key = block_contracts.call_key(first)
    template, reference_values, ranks = block_contracts.with_assumed_inputs(
        failed.reference, failed.reference_values, failed.ranks, failed.contracts
    )
    premises, block = run.prove(
        [
            Unit(captured.reference.skeleton, captured.reference.values, skeletons, laws, outputs_only=False),
            Unit(template, reference_values, ranks, outputs_only=False),
        ]
    )
    if premises.index is None or block.index is None:
        return None
    for program in captured.ranks:
        rank = program.skeleton.rank or 0
        call = next(
            (
                n
                for n in block_contracts.calls_of(program.skeleton, failed.template)
                if block_contracts.call_key(n) == key
            ),
            None,
        )
        contract = contracts.get(rank)
        if call is None or contract is None or len(call.inputs) != len(first.inputs):
            return None
        for ref_value, value, assumed in zip(first.inputs, call.inputs, contract.inputs, strict=False):
            if not block_contracts.holds(premises.index, ref_value, rank, value, assumed):
                return None
    instance = parse_key(key)[1] or failed.template
    failing = [
        position
        for position, ref_value in enumerate(template.outputs)
        if any(
            position >= len(graph.outputs)
            or not block_contracts.holds(
                block.index, ref_value, contract.rank, graph.outputs[position], contract.outputs[position]
            )
            for (graph, _), contract in zip(ranks, failed.contracts, strict=True)
        )
    ]
    if not failing:
        return None  # whole, the template proves what its parts did not: the plain run decides
    named = [_as_instance(graph, instance) for graph, _ in ranks]
    reference = _as_instance(template, instance)
    index = RelationIndex(reference, named, block.saturation.facts or {})
    return _finding_result(
        run,
        reference,
        named,
        [values for _, values in ranks],
        index,
        block,
        failing,
        f"block {instance} (one template for {len(failed.instances)} repeated blocks), on inputs proven to relate as"
        " that block's proof assumes",
    )


def localize_skeleton(run: FailedRun) -> WorldSizeResult | None:
    """The skeleton localized with every template's law (every template proven)."""
    from .units import Unit

    captured = run.captured
    skeletons, laws = block_contracts.skeletons_and_laws(captured.ranks, captured.units)
    (proof,) = run.prove(
        [Unit(captured.reference.skeleton, captured.reference.values, skeletons, laws, outputs_only=False)]
    )
    if proof.index is None:
        return None
    _, failing = output_relations(proof.index, proof.reference, proof.ranks, run.check.outputs)
    if not failing:
        return None
    return _finding_result(
        run,
        proof.reference,
        proof.ranks,
        [values for _, values in skeletons],
        proof.index,
        proof,
        failing,
        "the program outside its repeated blocks",
    )


def _finding_result(
    run: FailedRun,
    reference: Graph,
    ranks: list[Graph],
    rank_values: list[dict[str, Expr]],
    index: RelationIndex,
    proof: UnitProof,
    failing: list[int],
    where: str,
) -> WorldSizeResult:
    from .witness.run import witness
    from .witness.trials import compared_constants

    check, world_size = run.check, run.world_size

    evidence = Evidence(
        reference,
        ranks,
        rank_values,
        index,
        proof.encoded.issues,
        outputs_of=[len(ranks) - 1] if check.outputs == "last-rank" else None,
        factors=proof.encoded.factors,
        law_targets=proof.encoded.law_targets,
    )
    finding = explain(evidence, failing)
    result = WorldSizeResult(world_size, "unproven", seconds=run.seconds, stats=run.stats | {"localized_in": where})

    def run_witness(found: Discrepancy) -> dict[str, object]:
        node = reference.node_map().get(found.reference_node)
        module_path = node.module_path if node is not None else ""
        return witness(
            check, run.project, world_size, module_path, found.kind, None, compared_constants([reference, *ranks])
        )

    compared = evidence.outputs_of if evidence.outputs_of is not None else list(range(len(ranks)))
    note = (
        f"; found in {where}; the layers were not traced one by one, the model being too large to run with real"
        " numbers (`--no-memoize` traces every layer)"
    )
    return settle(result, finding, reference, index, compared, run_witness, note)


def _as_instance(graph: Graph, instance: str) -> Graph:
    """A template's graph with its module paths those of `instance` (a template is traced inside a
    wrapper whose attribute `block` holds it: `block.attention` is `layers.0.attention`)."""

    def renamed(path: str) -> str:
        if path == "block":
            return instance
        return instance + path[len("block") :] if path.startswith("block.") else path

    nodes = [dataclasses.replace(node, module_path=renamed(node.module_path)) for node in graph.nodes]
    return dataclasses.replace(graph, nodes=nodes)
