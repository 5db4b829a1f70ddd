"""Compute the numeric witness of a discrepancy (runs user code and torch: worker side)."""

from __future__ import annotations

from typing import Any

from ..config import Check, Project
from ..errors import ShardproofError
from ..graph.model import GradientRole
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


def compare_gradients_numerically(
    check: Check, project: Project, world_size: int, rank_roles: list[list[GradientRole | None]]
) -> NumericComparison:
    """Run `check`'s training steps at `world_size` with real numbers and compare every gradient
    with what each rank's shows of it (`rank_roles`: the gradient roles of each rank's capture)."""
    from ..capture.program import forget_project_modules, import_roots, load_callable
    from .gradients import run_gradients_and_compare

    if check.same_code_reference:
        raise NumericRunError("gradients of same-code checks (fairscale, Megatron) are not run with real numbers yet")
    gradients = check.gradients
    assert gradients is not None
    with import_roots(project.python_path):
        forget_project_modules(project)
        build_reference = load_callable(check.reference, "reference", check, project)
        make_inputs = load_callable(check.inputs, "inputs", check, project)
        build_parallel = load_callable(check.parallel, "parallel", check, project)
        steps = tuple(
            load_callable(spec, which, check, project) if spec is not None else None
            for which, spec in (
                ("reference-step", gradients.reference_step),
                ("parallel-step", gradients.parallel_step),
            )
        )
        return run_gradients_and_compare(
            build_reference,
            make_inputs,
            build_parallel,
            world_size,
            (steps[0], steps[1]),
            rank_roles,
            check.outputs,
            relation_override=check.relation_override,
        )


def witness(
    check: Check,
    project: Project,
    world_size: int,
    module_path: str = "",
    kind: str = "",
    rank_roles: list[list[GradientRole | None]] | None = None,
) -> dict[str, Any]:
    """The numeric witness of a discrepancy of `kind` found at `world_size`: "confirmed" with the
    errors at the outputs (or, with `rank_roles`, at the parameter gradients) and at the
    localized module, or "unconfirmed" with the reason."""
    if kind == "collective-mismatch":
        # Ranks that disagree on their collectives would wait for each other forever.
        return {
            "status": "unconfirmed",
            "reason": "the ranks make different collective calls, so a run with real numbers would hang",
        }
    # the gradients run in the full configuration only (the quick one is a forward check)
    attempts = ["full"] + (["quick"] if check.quick is not None and rank_roles is None else [])
    reasons: list[str] = []
    for configuration in attempts:
        try:
            if rank_roles is not None:
                comparison = compare_gradients_numerically(check, project, world_size, rank_roles)
            else:
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
            f"on random weights and the example inputs the {'gradients' if rank_roles is not None else 'outputs'} "
            f"agree within {RELATIVE_TOLERANCE:g} "
            f"(relative); the difference may need other inputs or weights"
        )
        return data
    return {"status": "unconfirmed", "reason": "; ".join(reasons) or "no configuration could be run"}
