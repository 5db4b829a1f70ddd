"""capture -> relate -> verify -> localize, for one check and its world sizes.

Runs inside the worker process (it imports user code and torch); saturations run in the
sandbox's own child processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .capture import collector
from .config import Check, Project
from .errors import CollectiveCallError, ShardproofError
from .memoized_run import verify_memoized
from .results import CheckResult, Discrepancy, Unsupported, WorldSizeResult
from .units import dropout_notes, outputs_summary, prove_units, unit_stats
from .verify.cache import cached_result, result_key, store_result
from .verify.cache import saturate as saturate_cached
from .verify.encode import encode_unit
from .verify.partition import partition, proven
from .verify.relations_found import RelationIndex
from .verify.sandbox import Sandbox
from .verify.verdict import output_relations

if TYPE_CHECKING:
    from .capture.program import CaptureResult, CheckCapture

__all__ = ["ProgressFn", "stored_result_key", "verify_check", "verify_memoized", "verify_world_size"]

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
    partition: bool = True,
) -> CheckResult:
    """Verify `check` at each world size. `prepare` may adopt a cached reference capture; every
    discrepancy is run with real numbers for a witness unless `numeric_witness` is off. With
    `memoize`, a model with repeated blocks is first verified block by block (see
    `verify_memoized`); anything that is not proven that way is verified the plain way, in parts
    at once unless `partition` is off (see `verify_world_size`). With
    `reuse_results` (the command line), a world size whose files are all unchanged since a run
    that stored its result is not verified again."""
    from .capture import environment
    from .capture.program import CheckCapture

    environment_at_start = environment.snapshot()
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
            key = (
                stored_result_key(check, project, world_size, f"memoize={memoize} partition={partition}")
                if reuse_results
                else None
            )
            stored = cached_result(key, environment_at_start) if key is not None else None
            if stored is not None:
                reused = WorldSizeResult.from_dict(stored)  # type: ignore[arg-type]
                reused.stats["reused"] = True
                result.results.append(reused)
                continue
            try:
                outcome = _verify_world_size(
                    capture, check, world_size, sandbox, notify, numeric_witness, memoize, partition
                )
            except Exception as exc:  # noqa: BLE001 - a bug of ours is a reported error, never a crash
                outcome = _internal_error(world_size, exc)
            if outcome is None:  # the reference itself failed: the check's error
                result.error = capture.reference_error
                return result
            result.results.append(outcome)
            if key is not None and outcome.verdict in ("verified", "discrepancy", "unproven", "inconclusive"):
                files = capture.dependencies(capture.captured)
                store_result(key, outcome.to_dict(), files, environment.names_read(), environment_at_start)
    finally:
        if own_sandbox:
            sandbox.close()
        if capture is not None:
            result.dependencies = sorted(capture.dependencies(capture.captured))
    return result


def stored_result_key(check: Check, project: Project, world_size: int, mode: str) -> str:
    """The key of a check's stored result: its declaration and where its code is imported from.
    Two copies of a project (a worktree, a bug variant) declare the same check but verify other
    files; the stored report names its files and lines, so each copy has its own."""
    where = [str(project.root.resolve()), *(str(path.resolve()) for path in project.python_path)]
    return result_key(f"{check!r} at {where}", world_size, mode)


def _verify_world_size(
    capture: CheckCapture,
    check: Check,
    world_size: int,
    sandbox: Sandbox,
    notify: ProgressFn,
    numeric_witness: bool,
    memoize: bool,
    partition: bool,
) -> WorldSizeResult | None:
    """One world size, block by block when that proves it, else the plain way; None when the
    reference itself cannot be captured (its error is `capture.reference_error`)."""
    if check.gradients is not None:
        # a joint graph is not cut into blocks: its backward runs through the blocks in reverse
        memoize = partition = False
    memoized = verify_memoized(capture, check, world_size, sandbox, notify) if memoize else None
    if memoized is not None:
        return memoized
    try:
        capture.reference()  # the whole reference, traced once for every world size
    except ShardproofError as exc:
        capture.reference_error = exc.to_dict()
        return None
    result = verify_world_size(capture, check, world_size, sandbox, notify, numeric_witness, partition)
    if capture.captured and result.verdict != "error":
        captured = capture.captured[-1]
        result.notes += dropout_notes([captured.reference.graph, *(r.graph for r in captured.ranks)])
    return result


def _internal_error(world_size: int, exc: Exception) -> WorldSizeResult:
    """A failure of shardproof itself (not of the user's code) at one world size, reported as an
    error of that world size with its traceback, so the other world sizes and checks still run."""
    import traceback

    message = f"shardproof failed while verifying ({type(exc).__name__}: {exc}); please report it with the detail"
    error = {"kind": "InternalError", "message": message, "site": None, "detail": traceback.format_exc()}
    return WorldSizeResult(world_size, "error", summary=message, error=error)


def _collective_call_discrepancy(exc: CollectiveCallError, world_size: int, seconds: float) -> WorldSizeResult:
    """A collective call every real run rejects, as a discrepancy at the call."""
    from .localize.sites import to_site

    primary = to_site(exc.site)
    finding = Discrepancy(
        "collective-mismatch",
        exc.message,
        primary,
        suggestion=exc.suggestion,
        witness={"status": "not-run", "reason": "the call fails before any output exists"},
    )
    return WorldSizeResult(
        world_size, "discrepancy", summary=exc.message, discrepancies=[finding], seconds={"capture": seconds}
    )


def verify_world_size(
    capture: object,
    check: Check,
    world_size: int,
    sandbox: Sandbox,
    progress: ProgressFn,
    numeric_witness: bool = True,
    partition: bool = True,
) -> WorldSizeResult:
    """The plain run: the whole world size captured at once, verified in parts at once when its
    blocks cut it into parts that each prove their share (`verify.partition`), else whole; the
    verdict and the location of anything not proven come from the whole."""
    from .capture.program import CheckCapture

    assert isinstance(capture, CheckCapture)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    progress(check.name, world_size, "capture")
    capture.progress = lambda stage: progress(check.name, world_size, stage)
    try:
        captured = capture.capture(world_size)
        capture.captured.append(captured)
    except CollectiveCallError as exc:
        return _collective_call_discrepancy(exc, world_size, time.perf_counter() - start)
    except ShardproofError as exc:
        return WorldSizeResult(
            world_size,
            "error",
            summary=exc.message,
            error=exc.to_dict(),
            seconds={"capture": time.perf_counter() - start},
        )
    seconds["capture"] = time.perf_counter() - start
    with collector.settled():  # the capture's objects are left out of the collections from here on
        if partition:
            partitioned = _verify_partitioned(captured, check, world_size, sandbox, progress, seconds)
            if partitioned is not None:
                return partitioned
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
        gaps = [gap for graph in ranks for gap in graph.gradient_gaps]
        if gaps and not failing and not unit.issues:
            result.verdict = "inconclusive"
            result.summary = f"not proven: {gaps[0]}"
            result.inconclusive.extend(Unsupported("unsupported-op", gap, "gradient") for gap in gaps)
            seconds["localization"] = time.perf_counter() - start
            return result
        if not failing and not unit.issues:
            result.summary = outputs_summary(outputs)
            seconds["localization"] = time.perf_counter() - start
            return result
        if not saturation.complete:
            message = _bound_message(saturation.status, saturation.message, check)
            result.verdict = "inconclusive"
            result.summary = f"not proven: {message}"
            result.inconclusive.append(Unsupported("bound", message))
            seconds["localization"] = time.perf_counter() - start
            return result
        # the localizer (and libcst, ~0.16 s to import) is loaded only for a run that needs it
        from .localize.diagnose import Evidence, explain
        from .localize.unproven import settle

        evidence = Evidence(
            captured.reference.graph,
            ranks,
            [r.values for r in captured.ranks],
            index,
            unit.issues,
            outputs_of=[len(ranks) - 1] if check.outputs == "last-rank" else None,
            factors=unit.factors,
            law_targets=unit.law_targets,
            rank_numbers=[r.numbers for r in captured.ranks],
        )
        finding = explain(evidence, failing)
        seconds["localization"] = time.perf_counter() - start

        def run_witness(found: Discrepancy) -> dict[str, object]:
            if not numeric_witness:
                return {"status": "not-run", "reason": "the numeric witness was not run"}
            progress(check.name, world_size, "numeric witness")
            begun = time.perf_counter()
            shown_by = _witness(found, check, capture.project, captured, world_size)
            seconds["witness"] = time.perf_counter() - begun
            return shown_by

        compared_ranks = evidence.outputs_of if evidence.outputs_of is not None else list(range(len(ranks)))
        return settle(result, finding, captured.reference.graph, index, compared_ranks, run_witness)


def _witness(
    finding: Discrepancy, check: Check, project: Project, captured: CaptureResult, world_size: int
) -> dict[str, object]:
    """Real numbers for `finding`: at the module holding its reference value, on inputs that try
    the integers the programs compare against; a gradients check runs its training steps."""
    from .witness.run import witness  # imports torch: only here, in the worker
    from .witness.trials import compared_constants

    graphs = [captured.reference.graph, *(r.graph for r in captured.ranks)]
    reference_node = captured.reference.graph.node_map().get(finding.reference_node)
    module_path = reference_node.module_path if reference_node is not None else ""
    gradients = bool(captured.reference.graph.gradient_roles)
    rank_roles = [r.graph.gradient_roles for r in captured.ranks] if gradients else None
    return witness(check, project, world_size, module_path, finding.kind, rank_roles, compared_constants(graphs))


def _verify_partitioned(
    captured: CaptureResult,
    check: Check,
    world_size: int,
    sandbox: Sandbox,
    progress: ProgressFn,
    seconds: dict[str, float],
) -> WorldSizeResult | None:
    """`verified` when every part of the cut world size proves its share, else None (and the
    time spent on the parts in `seconds`)."""
    start = time.perf_counter()
    ranks = [(r.graph, r.values) for r in captured.ranks]
    parts = partition(captured.reference.graph, captured.reference.values, ranks)
    if parts is None:
        return None
    progress(check.name, world_size, "verification")
    proofs = prove_units(sandbox, check, [(part.reference, part.reference_values, part.ranks) for part in parts])
    proven_parts = all(
        proof.index is not None and proven(part, proof.index) for part, proof in zip(parts, proofs, strict=True)
    )
    outputs = proofs[-1].outputs(check.outputs) if proven_parts else None  # the last part holds the outputs
    if outputs is None:
        seconds["verification in parts"] = time.perf_counter() - start
        return None
    seconds = seconds | {"verification": time.perf_counter() - start}
    stats = {
        "reference_nodes": len(captured.reference.graph.nodes),
        "rank_nodes": sum(len(r.graph.nodes) for r in captured.ranks),
        "parts": len(parts),
    } | unit_stats(proofs)
    return WorldSizeResult(
        world_size, "verified", outputs=outputs, summary=outputs_summary(outputs), seconds=seconds, stats=stats
    )
