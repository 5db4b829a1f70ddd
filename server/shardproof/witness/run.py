"""Compute the numeric witness of a discrepancy (runs user code and torch: worker side)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..config import Check, Project
from ..errors import ShardproofError
from ..graph.model import GradientRole
from .numeric import NumericComparison, NumericRunError, run_and_compare
from .trials import SEEDS

Load = Callable[[str | None, str], Any]  # ("module:function" or None, its role) -> the callable or None


@contextlib.contextmanager
def _user_code(check: Check, project: Project) -> Iterator[tuple[tuple[Any, Any, Any], Load]]:
    """While active, the project's modules import afresh from its python path: the check's
    reference builder, inputs and parallel builder, and a loader of its other callables."""
    from ..capture.project_code import forget_project_modules, import_roots, load_callable

    def load(spec: str | None, role: str) -> Any:
        return None if spec is None else load_callable(spec, role, check, project)

    with import_roots(project.python_path):
        forget_project_modules(project)
        builders = (load(check.reference, "reference"), load(check.inputs, "inputs"), load(check.parallel, "parallel"))
        yield builders, load


def compare_numerically(
    check: Check,
    project: Project,
    world_size: int,
    module_path: str = "",
    configuration: str = "full",
    compared: list[int] | None = None,
    seeds: tuple[int, ...] = SEEDS,
) -> NumericComparison:
    """Run `check` (or its quick configuration) at `world_size` with real numbers, on every seed
    and input trial (`trials.py`; `compared`: the integers the programs compare against)."""
    chosen = check.for_mode(configuration)
    if chosen.same_code_reference:
        # fairscale and Megatron keep process-global model-parallel state: one process per rank
        from .rank_processes import run_same_code

        return run_same_code(check, project, world_size, module_path, configuration, seeds, compared)
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
            compared=compared or (),
            seeds=seeds,
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
    compared: list[int] | None = None,
) -> dict[str, Any]:
    """The numeric witness of a finding of `kind` at `world_size`: "confirmed" with the errors at
    the outputs (or, with `rank_roles`, at the parameter gradients), at the localized module, or
    the rank that fails; "agree" when every trial agreed (the trials are listed); "not-run" with
    the reason. Never raises: whatever stops the run is the reason."""
    if kind == "collective-mismatch":
        # Ranks that disagree on their collectives would wait for each other forever.
        return {
            "status": "not-run",
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
                comparison = compare_numerically(check, project, world_size, module_path, configuration, compared)
        except (NumericRunError, ShardproofError) as exc:
            reasons.append(f"{configuration} configuration: {getattr(exc, 'message', None) or exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - a witness never takes the verification down
            reasons.append(f"{configuration} configuration: {type(exc).__name__}: {exc}")
            continue
        data = comparison.to_dict()
        if comparison.differs:
            data["status"] = "confirmed"
            return data
        data["status"] = "agree"
        what = "gradients" if rank_roles is not None else "outputs"
        data["reason"] = (
            f"the {what} agree within {comparison.tolerance:g} (relative) on {len(comparison.trials)} "
            f"trial{'' if len(comparison.trials) == 1 else 's'}"
        )
        return data
    return {"status": "not-run", "reason": "; ".join(reasons) or "no configuration could be run"}
