"""Compute the numeric witness of a discrepancy (runs user code and torch: worker side)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..config import Check, Project
from ..errors import ShardproofError
from ..graph.model import GradientRole
from .numeric import RELATIVE_TOLERANCE, NumericComparison, NumericRunError, run_and_compare

Load = Callable[[str | None, str], Any]  # ("module:function" or None, its role) -> the callable or None


@contextlib.contextmanager
def _user_code(check: Check, project: Project) -> Iterator[tuple[tuple[Any, Any, Any], Load]]:
    """While active, the project's modules import afresh from its python path: the check's
    reference builder, inputs and parallel builder, and a loader of its other callables."""
    from ..capture.program import forget_project_modules, import_roots, load_callable

    def load(spec: str | None, role: str) -> Any:
        return None if spec is None else load_callable(spec, role, check, project)

    with import_roots(project.python_path):
        forget_project_modules(project)
        builders = (load(check.reference, "reference"), load(check.inputs, "inputs"), load(check.parallel, "parallel"))
        yield builders, load


def compare_numerically(
    check: Check, project: Project, world_size: int, module_path: str = "", configuration: str = "full"
) -> NumericComparison:
    """Run `check` (or its quick configuration) at `world_size` with real numbers."""
    chosen = check.for_mode(configuration)
    if chosen.same_code_reference:
        # fairscale and Megatron keep process-global model-parallel state: one process per rank
        from .rank_processes import run_same_code

        return run_same_code(check, project, world_size, module_path, configuration)
    with _user_code(chosen, project) as ((build_reference, make_inputs, build_parallel), _):
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
    from .gradients import run_gradients_and_compare

    if check.same_code_reference:
        raise NumericRunError("gradients of same-code checks (fairscale, Megatron) are not run with real numbers yet")
    gradients = check.gradients
    assert gradients is not None
    with _user_code(check, project) as ((build_reference, make_inputs, build_parallel), load):
        reference_step = load(gradients.reference_step, "reference-step")
        parallel_step = load(gradients.parallel_step, "parallel-step")
        return run_gradients_and_compare(
            build_reference,
            make_inputs,
            build_parallel,
            world_size,
            (reference_step, parallel_step),
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
