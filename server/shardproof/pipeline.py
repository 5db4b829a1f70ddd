"""capture -> relate -> verify -> localize, for one check and its world sizes.

Runs inside the worker process (it imports user code and torch); saturations run in the
sandbox's own child processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .config import Check, Project
from .errors import ShardproofError
from .localize.diagnose import Evidence, explain
from .results import CheckResult, Discrepancy, Unsupported, WorldSizeResult
from .verify.cache import cached_result, result_key, store_result
from .verify.cache import saturate as saturate_cached
from .verify.encode import encode_unit
from .verify.relations_found import RelationIndex
from .verify.sandbox import Sandbox
from .verify.verdict import output_relations

if TYPE_CHECKING:
    from .capture.program import CheckCapture
    from .graph.model import Graph
    from .relations.expr import Expr
    from .results import OutputRelation
    from .verify.encode import EncodedUnit
    from .verify.engine import Saturation

ProgressFn = Callable[[str, int, str], None]  # (check name, world size, stage)


def _bound_message(status: str, message: str, check: Check) -> str:
    bounds = check.bounds
    return {
        "iteration-limit": f"the saturation reached its iteration bound ({bounds.iterations}) before a fixpoint",
        "time-limit": f"the saturation reached its time bound ({bounds.seconds:.0f} s)",
        "size-limit": f"the e-graph reached its size bound ({bounds.max_rows} rows)",
        "memory-limit": message or f"the saturation ran out of its memory bound ({bounds.memory_mb} MiB)",
    }.get(status, message or status)


def verify_check(
    check: Check,
    project: Project,
    world_sizes: list[int] | None = None,
    sandbox: Sandbox | None = None,
    progress: ProgressFn | None = None,
    prepare: Callable[[object], None] | None = None,
    numeric_witness: bool = True,
    memoize: bool = True,
    reuse_results: bool = False,
) -> CheckResult:
    """Verify `check` at each world size. `prepare` may adopt a cached reference capture; every
    discrepancy is run with real numbers for a witness unless `numeric_witness` is off. With
    `memoize`, a model with repeated blocks is first verified block by block (see
    `verify_memoized`); anything that is not proven that way is verified the plain way. With
    `reuse_results` (the command line), a world size whose files are all unchanged since a run
    that stored its result is not verified again."""
    from .capture.program import CheckCapture

    notify: ProgressFn = progress or (lambda *_: None)
    result = CheckResult(check.name)
    sizes = world_sizes or list(check.world_sizes)
    own_sandbox = sandbox is None
    sandbox = sandbox or Sandbox(check.bounds.memory_mb)
    capture: CheckCapture | None = None
    try:
        try:
            capture = CheckCapture(check, project, progress=lambda stage: notify(check.name, 0, stage))
            if prepare is not None:
                prepare(capture)
        except ShardproofError as exc:
            result.error = exc.to_dict()
            return result
        for world_size in sizes:
            key = result_key(repr(check), world_size, memoize) if reuse_results else None
            stored = cached_result(key) if key is not None else None
            if stored is not None:
                reused = WorldSizeResult.from_dict(stored)  # type: ignore[arg-type]
                reused.stats["reused"] = True
                result.results.append(reused)
                continue
            outcome = _verify_world_size(capture, check, world_size, sandbox, notify, numeric_witness, memoize)
            if outcome is None:  # the reference itself failed: the check's error
                result.error = capture.reference_error
                return result
            result.results.append(outcome)
            if key is not None and outcome.verdict in ("verified", "discrepancy", "inconclusive"):
                store_result(key, outcome.to_dict(), capture.dependencies(capture.captured))
    finally:
        if own_sandbox:
            sandbox.close()
        if capture is not None:
            result.dependencies = sorted(capture.dependencies(capture.captured))
    return result


def _verify_world_size(
    capture: CheckCapture,
    check: Check,
    world_size: int,
    sandbox: Sandbox,
    notify: ProgressFn,
    numeric_witness: bool,
    memoize: bool,
) -> WorldSizeResult | None:
    """One world size, block by block when that proves it, else the plain way; None when the
    reference itself cannot be captured (its error is `capture.reference_error`)."""
    memoized = verify_memoized(capture, check, world_size, sandbox, notify) if memoize else None
    if memoized is not None:
        return memoized
    try:
        capture.reference()  # the whole reference, traced once for every world size
    except ShardproofError as exc:
        capture.reference_error = exc.to_dict()
        return None
    return verify_world_size(capture, check, world_size, sandbox, notify, numeric_witness)


def verify_world_size(
    capture: object,
    check: Check,
    world_size: int,
    sandbox: Sandbox,
    progress: ProgressFn,
    numeric_witness: bool = True,
) -> WorldSizeResult:
    from .capture.program import CheckCapture

    assert isinstance(capture, CheckCapture)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    progress(check.name, world_size, "capture")
    capture.progress = lambda stage: progress(check.name, world_size, stage)
    try:
        captured = capture.capture(world_size)
        capture.captured.append(captured)
    except ShardproofError as exc:
        return WorldSizeResult(
            world_size,
            "error",
            summary=exc.message,
            error=exc.to_dict(),
            seconds={"capture": time.perf_counter() - start},
        )
    seconds["capture"] = time.perf_counter() - start
    progress(check.name, world_size, "relations")
    start = time.perf_counter()
    unit = encode_unit(
        captured.reference.graph, captured.reference.values, [(r.graph, r.values) for r in captured.ranks]
    )
    seconds["relations"] = time.perf_counter() - start
    progress(check.name, world_size, "verification")
    start = time.perf_counter()
    bounds = check.bounds
    saturation, cached = saturate_cached(sandbox, unit.commands, bounds.iterations, bounds.seconds, bounds.max_rows)
    seconds["verification"] = time.perf_counter() - start
    stats = {
        "reference_nodes": len(captured.reference.graph.nodes),
        "rank_nodes": sum(len(r.graph.nodes) for r in captured.ranks),
        "terms": unit.n_terms,
        "egraph_rows": saturation.rows,
        "iterations": saturation.iterations,
        "saturation_status": saturation.status,
        "saturation_seconds": round(saturation.seconds, 4),
        "cached_units": int(cached),
    }
    if saturation.facts is None:
        message = _bound_message(saturation.status, saturation.message, check)
        return WorldSizeResult(
            world_size,
            "inconclusive",
            summary=message,
            inconclusive=[Unsupported("bound", message)],
            seconds=seconds,
            stats=stats,
        )
    progress(check.name, world_size, "localization")
    start = time.perf_counter()
    ranks = [r.graph for r in captured.ranks]
    index = RelationIndex(captured.reference.graph, ranks, saturation.facts)
    outputs, failing = output_relations(index, captured.reference.graph, ranks, check.outputs)
    result = WorldSizeResult(world_size, "verified", outputs=outputs, seconds=seconds, stats=stats)
    if not failing and not unit.issues:
        result.summary = "; ".join(f"output {o.index}: {o.description}" for o in outputs)
        seconds["localization"] = time.perf_counter() - start
        return result
    if not saturation.complete:
        message = _bound_message(saturation.status, saturation.message, check)
        result.verdict = "inconclusive"
        result.summary = f"not proven: {message}"
        result.inconclusive.append(Unsupported("bound", message))
        seconds["localization"] = time.perf_counter() - start
        return result
    evidence = Evidence(captured.reference.graph, ranks, [r.values for r in captured.ranks], index, unit.issues)
    finding = explain(evidence, failing)
    if isinstance(finding, Discrepancy):
        result.verdict = "discrepancy"
        result.discrepancies.append(finding)
        result.summary = finding.message
        seconds["localization"] = time.perf_counter() - start
        if numeric_witness:
            from .witness.run import witness  # imports torch: only here, in the worker

            progress(check.name, world_size, "numeric witness")
            start = time.perf_counter()
            reference_node = captured.reference.graph.node_map().get(finding.reference_node)
            module_path = reference_node.module_path if reference_node is not None else ""
            finding.witness = witness(check, capture.project, world_size, module_path, finding.kind)
            seconds["witness"] = time.perf_counter() - start
            return result
    else:
        result.verdict = "inconclusive"
        result.inconclusive.append(finding)
        result.summary = finding.message
    seconds["localization"] = time.perf_counter() - start
    return result


def verify_memoized(
    capture: object, check: Check, world_size: int, sandbox: Sandbox, progress: ProgressFn
) -> WorldSizeResult | None:
    """Verify a model with repeated blocks block by block: every distinct block (template) once,
    with the same inputs in every program, then the skeletons with each block an opaque call, the
    same in the reference and the ranks because its template was proven. The verdict is
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
    stats: dict[str, object] = {"templates": len(captured.units), "block_instances": captured.instance_count}
    progress(check.name, world_size, "verification")
    start = time.perf_counter()
    proofs = _UnitProofs(sandbox, check)
    for unit in captured.units:
        if proofs.prove(unit.reference, unit.reference_values, unit.ranks, "replicated") is None:
            return None
    skeletons = [(p.skeleton, p.values) for p in captured.ranks]
    outputs = proofs.prove(captured.reference.skeleton, captured.reference.values, skeletons, check.outputs)
    if outputs is None:
        return None
    encoded, saturation = proofs.last
    ranks = [graph for graph, _ in skeletons]
    seconds["verification"] = time.perf_counter() - start
    stats |= {
        "reference_nodes": len(captured.reference.skeleton.nodes),
        "rank_nodes": sum(len(g.nodes) for g in ranks),
        "terms": encoded.n_terms,
        "egraph_rows": saturation.rows,
        "saturation_seconds": round(proofs.saturation_seconds, 4),
        "saturation_status": next((status for status in proofs.statuses if status != "fixpoint"), "fixpoint"),
        "units": len(proofs.statuses),
        "cached_units": proofs.cached_units,
    }
    summary = "; ".join(f"output {o.index}: {o.description}" for o in outputs)
    summary += f" ({captured.instance_count} repeated blocks verified as {len(captured.units)} distinct)"
    return WorldSizeResult(world_size, "verified", outputs=outputs, summary=summary, seconds=seconds, stats=stats)


class _UnitProofs:
    """Saturates the units of a memoized run one by one (from the cache when it holds them) and
    keeps their totals for the stats."""

    def __init__(self, sandbox: Sandbox, check: Check) -> None:
        self.sandbox, self.bounds = sandbox, check.bounds
        self.saturation_seconds = 0.0
        self.cached_units = 0
        self.statuses: list[str] = []
        self.last: tuple[EncodedUnit, Saturation]

    def prove(
        self,
        reference: Graph,
        reference_values: dict[str, Expr],
        ranks: list[tuple[Graph, dict[str, Expr]]],
        policy: str,
    ) -> list[OutputRelation] | None:
        """The unit's output relations when every output meets `policy`, else None."""
        encoded = encode_unit(reference, reference_values, ranks)
        bounds = self.bounds
        saturation, cached = saturate_cached(
            self.sandbox, encoded.commands, bounds.iterations, bounds.seconds, bounds.max_rows
        )
        self.saturation_seconds += 0.0 if cached else saturation.seconds
        self.cached_units += cached
        self.statuses.append(saturation.status)
        self.last = (encoded, saturation)
        if saturation.facts is None or encoded.issues:
            return None
        graphs = [graph for graph, _ in ranks]
        index = RelationIndex(reference, graphs, saturation.facts)
        outputs, failing = output_relations(index, reference, graphs, policy)
        return None if failing else outputs
