"""The numeric witness of a gradients check: parameter gradients with real numbers.

The reference and every rank run their training step (or, without steps, differentiate their
outputs with one random cotangent shared by all) in float64 on random weights and the example
inputs, each rank on its own thread of the threaded process group, so the gradient all-reduces
of the parallel step really run. Every reference gradient is then compared with what each rank's
gradient shows of it: the whole gradient, or the block the rank's parameter holds (the gradient
roles found by the capture: which rank parameter, which block, where in a packed parameter).
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ..capture.gradients import shown_part
from ..graph.model import GradientRole
from .numeric import (
    Difference,
    NumericComparison,
    NumericRunError,
    RelationOverride,
    compare_runs,
    default_dtype,
    difference,
    random_reference,
    run_ranks,
    to_float64,
)

Step = Callable[..., Any]
Gradients = dict[str, torch.Tensor | None]
Run = tuple[list[Any], Gradients]  # a step's flattened outputs and every parameter's gradient


def run_gradients_and_compare(
    build_reference: Callable[[], Any],
    make_inputs: Callable[[], Any],
    build_parallel: Callable[..., Any],
    world_size: int,
    steps: tuple[Step | None, Step | None],
    rank_roles: list[list[GradientRole | None]],
    output_relation: str = "replicated",
    configuration: str = "full",
    seed: int = 0,
    relation_override: RelationOverride | None = None,
) -> NumericComparison:
    """The steps' outputs (under `output_relation`) and every reference parameter's gradient
    against each rank's counterparts. Raises NumericRunError when the steps cannot be run with
    real numbers."""
    start = time.perf_counter()
    reference_step, parallel_step = steps
    with default_dtype(torch.float64), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference, example_inputs = random_reference(build_reference, make_inputs, seed)
        inputs = to_float64(example_inputs)
        copies = [copy.deepcopy(reference) for _ in range(world_size)]
        cotangents = _cotangents(reference, inputs, seed) if reference_step is None else []
        try:
            expected = _gradients(reference, inputs, reference_step, cotangents)
        except Exception as exc:  # noqa: BLE001 - reported as the reason no witness exists
            raise NumericRunError(f"the reference step failed with real numbers: {type(exc).__name__}: {exc}") from None
        found = run_ranks(
            copies,
            build_parallel,
            world_size,
            relation_override or (lambda _name: None),
            lambda module, _rank: _gradients(module, inputs, parallel_step, cotangents),
        )
    (reference_outputs, expected_gradients), rank_runs = expected, found
    result = compare_runs(reference_outputs, [o for o, _ in rank_runs], {}, world_size, output_relation, "", "")
    result.configuration = configuration
    gradients = compare_gradients(expected_gradients, [g for _, g in rank_runs], rank_roles)
    result.outputs = sorted(result.outputs + gradients, key=lambda d: not d.differs)
    result.inputs, result.seed = "the example inputs", seed
    result.trials = [result.trial()]
    result.seconds = time.perf_counter() - start
    return result


def _cotangents(reference: nn.Module, inputs: tuple[Any, ...], seed: int) -> list[torch.Tensor]:
    """One random cotangent per output (the capture makes it an input, the same on every rank)."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        flat = [t for t in tree_flatten(reference(*inputs))[0] if isinstance(t, torch.Tensor)]
    return [torch.randn(t.shape, generator=generator, dtype=t.dtype) if t.is_floating_point() else t for t in flat]


def _gradients(module: nn.Module, inputs: tuple[Any, ...], step: Step | None, cotangents: list[torch.Tensor]) -> Run:
    for parameter in module.parameters():
        parameter.grad = None
    with torch.enable_grad():
        if step is None:
            flat = [t for t in tree_flatten(module(*inputs))[0] if isinstance(t, torch.Tensor)]
            pairs = [(o, c) for o, c in zip(flat, cotangents, strict=True) if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
        else:
            flat = [t for t in tree_flatten(step(module, *inputs))[0] if isinstance(t, torch.Tensor)]
    return [t.detach().clone() for t in flat], {
        name: None if p.grad is None else p.grad.detach().clone()
        for name, p in module.named_parameters(remove_duplicate=False)
    }


def compare_gradients(
    expected: Gradients, found: list[Gradients], rank_roles: list[list[GradientRole | None]]
) -> list[Difference]:
    """Per reference parameter with a gradient, the worst error over the ranks that show it."""
    differences: list[Difference] = []
    for parameter, reference_gradient in expected.items():
        if reference_gradient is None:
            continue
        worst: Difference | None = None
        for rank, roles in enumerate(rank_roles):
            role = next((r for r in roles if r is not None and r.parameter == parameter), None)
            if role is None or role.rank_parameter is None:
                continue
            wanted = reference_gradient
            if role.dim is not None:
                wanted = reference_gradient.narrow(role.dim, role.start, role.end - role.start)
            gradient = found[rank].get(role.rank_parameter)
            # (none: a frozen, detached or unused parameter, whose gradient is zero)
            shown = torch.zeros_like(wanted) if gradient is None else shown_part(gradient, role.rank_block)
            candidate = difference(f"gradient of {parameter}", wanted, shown)
            candidate.note = f"rank {rank}" + (f": {candidate.note}" if candidate.note else "")
            if worst is None or (candidate.max_rel, candidate.max_abs) > (worst.max_rel, worst.max_abs):
                worst = candidate
        if worst is not None:
            differences.append(worst)
    return sorted(differences, key=lambda d: not d.differs)
