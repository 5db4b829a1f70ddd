"""Compute the numeric witness of a discrepancy (runs user code and torch: worker side)."""

from __future__ import annotations

from typing import Any

from ..config import Check, Project
from ..errors import ShardproofError
from .numeric import RELATIVE_TOLERANCE, NumericComparison, NumericRunError, run_and_compare


def compare_numerically(
    check: Check, project: Project, world_size: int, module_path: str = "", configuration: str = "full"
) -> NumericComparison:
    """Run `check` (or its quick configuration) at `world_size` with real numbers."""
    from ..capture.program import forget_project_modules, import_roots, load_callable

    chosen = check.for_mode(configuration)
    if chosen.same_code_reference:
        # fairscale and Megatron keep process-global model-parallel state: one process per rank
        from .rank_processes import run_same_code

        return run_same_code(check, project, world_size, module_path, configuration)
    with import_roots(project.python_path):
        forget_project_modules(project)
        build_reference = load_callable(chosen.reference, "reference", chosen, project)
        make_inputs = load_callable(chosen.inputs, "inputs", chosen, project)
        build_parallel = load_callable(chosen.parallel, "parallel", chosen, project)
        return run_and_compare(
            build_reference,
            make_inputs,
            build_parallel,
            world_size,
            check.outputs,
            module_path=module_path,
            configuration=configuration,
            relation_override=chosen.relation_override,
        )


def witness(check: Check, project: Project, world_size: int, module_path: str = "", kind: str = "") -> dict[str, Any]:
    """The numeric witness of a discrepancy of `kind` found at `world_size`: "confirmed" with the
    errors at the outputs and at the localized module, or "unconfirmed" with the reason."""
    if kind == "collective-mismatch":
        # Ranks that disagree on their collectives would wait for each other forever.
        return {
            "status": "unconfirmed",
            "reason": "the ranks make different collective calls, so a run with real numbers would hang",
        }
    attempts = ["full"] + (["quick"] if check.quick is not None else [])
    reasons: list[str] = []
    for configuration in attempts:
        try:
            comparison = compare_numerically(check, project, world_size, module_path, configuration)
        except (NumericRunError, ShardproofError) as exc:
            reasons.append(f"{configuration} configuration: {getattr(exc, 'message', None) or exc}")
            continue
        data = comparison.to_dict()
        data["tolerance"] = RELATIVE_TOLERANCE
        if comparison.differs:
            data["status"] = "confirmed"
            return data
        data["status"] = "unconfirmed"
        data["reason"] = (
            f"on random weights and the example inputs the outputs agree within {RELATIVE_TOLERANCE:g} "
            f"(relative); the difference may need other inputs or weights"
        )
        return data
    return {"status": "unconfirmed", "reason": "; ".join(reasons) or "no configuration could be run"}
