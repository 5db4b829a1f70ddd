"""The memoized run: every distinct block (template) proven once, then the skeletons with each
block an opaque call (capture/memoized.py, verify/block_contracts.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .capture import collector
from .errors import ShardproofError
from .results import WorldSizeResult
from .units import Unit, UnitProof, dropout_notes, outputs_summary, prove_units, unit_stats
from .verify import block_contracts
from .verify.partition import HALVE_FROM, Part, partition_block, proven

if TYPE_CHECKING:
    from .capture.memoized import TemplateUnit
    from .config import Check
    from .memoized_failure import FailedRun
    from .pipeline import ProgressFn
    from .verify.sandbox import Sandbox


def verify_memoized(
    capture: object, check: Check, world_size: int, sandbox: Sandbox, progress: ProgressFn
) -> WorldSizeResult | None:
    """Verify a model with repeated blocks block by block: every distinct block (template) once,
    with each rank's inputs assumed to relate to the reference's as their shapes say (equal, or the
    rank's block of a sequence), then the skeletons with each block an opaque call, related across
    programs by what its template's proof guarantees (verify/block_contracts.py). The verdict is
    `verified` or None: a template or skeleton that is not proven this way is left to the plain
    run, which gives the verdict and the location (so both ways always agree)."""
    from .capture.memoized import NotMemoizable, capture_memoized
    from .capture.program import CheckCapture

    assert isinstance(capture, CheckCapture)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    progress(check.name, world_size, "capture")
    try:
        captured = capture_memoized(capture, world_size)
    except (NotMemoizable, ShardproofError):
        return None
    seconds["capture"] = time.perf_counter() - start
    with collector.settled():  # the capture's objects are left out of verification's collections
        terms = [contract for unit in captured.units for contract in unit.contracts]
        # the template proofs and the skeleton's are saturated at once: the skeleton's rules state
        # what each template must guarantee, and it is checked below that its proof does
        skeletons, laws = block_contracts.skeletons_and_laws(captured.ranks, captured.units)
        if any(not contract.congruent for contract in terms) and not laws:
            return None  # a block sharded with no inputs: no rule could relate its calls
        sharded = {contract.template for contract in terms if not contract.congruent}
        stats: dict[str, object] = {
            "templates": len(captured.units),
            "block_instances": captured.instance_count,
            "stored_rank_captures": captured.stored_ranks,
        }
        if sharded:
            stats["templates_entered_sharded"] = len(sharded)
        progress(check.name, world_size, "verification")
        start = time.perf_counter()
        skeleton = Unit(captured.reference.skeleton, captured.reference.values, skeletons, laws)
        # many ranks: the templates cut finer first (parts of half the ranks, see partition_block),
        # then, where a finer cut's obligations are not all proven, as they are cut for fewer ranks
        finer = any(len(unit.ranks) >= HALVE_FROM for unit in captured.units)
        proofs, failed = _prove_templates(captured.units, skeleton, sandbox, check, finer)
        if failed is not None and finer:
            proofs, failed = _prove_templates(captured.units, skeleton, sandbox, check, finer=False)
        outputs = proofs[-1].outputs(check.outputs) if failed is None else None
        if outputs is None:
            from .memoized_failure import FailedRun

            def prove(units: list[Unit]) -> list[UnitProof]:
                return prove_units(sandbox, check, units)

            run = FailedRun(captured, check, capture.project, world_size, prove, seconds, stats)
            return _not_proven(run, failed, progress, start)
        seconds["verification"] = time.perf_counter() - start
        stats |= {
            "reference_nodes": len(captured.reference.skeleton.nodes),
            "rank_nodes": sum(len(g.nodes) for g, _ in skeletons),
        } | unit_stats(proofs)
        summary = outputs_summary(outputs)
        summary += f" ({captured.instance_count} repeated blocks verified as {len(captured.units)} distinct"
        summary += f", {len(sharded)} of them entered sharded)" if sharded else ")"
        graphs = [captured.reference.skeleton, *(program.skeleton for program in captured.ranks)]
        graphs += [graph for unit in captured.units for graph in (unit.reference, *(g for g, _ in unit.ranks))]
        notes = dropout_notes(graphs)
        return WorldSizeResult(
            world_size, "verified", outputs=outputs, summary=summary, seconds=seconds, stats=stats, notes=notes
        )


def _prove_templates(
    templates: list[TemplateUnit], skeleton: Unit, sandbox: Sandbox, check: Check, finer: bool
) -> tuple[list[UnitProof], TemplateUnit | None]:
    """Prove every template (`TemplateUnit`) and the skeleton at once; the proofs, and the first
    template whose proof does not give what its contracts require (None: every one does)."""
    units: list[Unit] = []
    # per template, its units: the template whole, or its parts (cut at its sub-modules, like a
    # large block of a world size, so that they saturate at once in smaller e-graphs)
    template_parts: list[list[Part] | None] = []
    for unit in templates:
        assumed = block_contracts.with_assumed_inputs(unit.reference, unit.reference_values, unit.ranks, unit.contracts)
        parts = partition_block(*assumed, finer=finer)
        template_parts.append(parts)
        if parts is None:
            units.append(Unit(*assumed))
        else:
            # the parts' obligations read relations of values inside the block, not only outputs
            units.extend(Unit(p.reference, p.reference_values, p.ranks, outputs_only=False) for p in parts)
    # only the units' outputs are read: anything else not proven is left to the plain run
    proofs = prove_units(sandbox, check, [*units, skeleton], outputs_only=True)
    position = 0
    for unit, parts in zip(templates, template_parts, strict=True):
        own = proofs[position : position + (len(parts) if parts is not None else 1)]
        position += len(own)
        last = own[-1]  # the template whole, or its last part: the one holding its outputs
        index = last.index
        parts_proven = parts is None or all(
            proof.index is not None and proven(part, proof.index) for part, proof in zip(parts, own, strict=True)
        )
        if not parts_proven or (
            index is None
            or not all(
                block_contracts.guaranteed(contract, index, last.reference, rank)
                for contract, rank in zip(unit.contracts, last.ranks, strict=True)
            )
        ):
            return proofs, unit
    return proofs, None


def _not_proven(
    run: FailedRun, failed: TemplateUnit | None, progress: ProgressFn, start: float
) -> WorldSizeResult | None:
    """A memoized run not proven: None (the plain run decides), or for a model too large to run
    with real numbers, the failed unit localized (memoized_failure.py)."""
    from . import memoized_failure

    elements = memoized_failure.too_large_for_numbers(run.captured)
    if elements is None:
        return None
    progress(run.check.name, run.world_size, "localization")
    run.stats = run.stats | {"parameter_elements": elements}
    if failed is not None:
        found = memoized_failure.localize_template(run, failed)
    else:
        found = memoized_failure.localize_skeleton(run)
    run.seconds["verification"] = time.perf_counter() - start
    return found
