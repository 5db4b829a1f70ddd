"""capture -> relate -> verify -> localize, for one check and its world sizes.

Runs inside the worker process (it imports user code and torch); saturations run in the
sandbox's own child processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .config import Check, Project
from .errors import ShardproofError
from .localize.diagnose import Evidence, explain
from .results import CheckResult, Discrepancy, Unsupported, WorldSizeResult
from .verify.encode import encode_unit
from .verify.relations_found import RelationIndex
from .verify.sandbox import Sandbox
from .verify.verdict import output_relations

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
) -> CheckResult:
    """Verify `check` at each world size. `prepare` may adopt a cached reference capture; every
    discrepancy is run with real numbers for a witness unless `numeric_witness` is off."""
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
            capture.reference()
        except ShardproofError as exc:
            result.error = exc.to_dict()
            return result
        for world_size in sizes:
            result.results.append(verify_world_size(capture, check, world_size, sandbox, notify, numeric_witness))
    finally:
        if own_sandbox:
            sandbox.close()
        if capture is not None:
            result.dependencies = sorted(capture.dependencies(capture.captured))
    return result


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
    saturation = sandbox.saturate(unit.commands, bounds.iterations, bounds.seconds, bounds.max_rows)
    seconds["verification"] = time.perf_counter() - start
    stats = {
        "reference_nodes": len(captured.reference.graph.nodes),
        "rank_nodes": sum(len(r.graph.nodes) for r in captured.ranks),
        "terms": unit.n_terms,
        "egraph_rows": saturation.rows,
        "iterations": saturation.iterations,
        "saturation_status": saturation.status,
        "saturation_seconds": round(saturation.seconds, 4),
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
