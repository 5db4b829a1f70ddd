"""How the numbers of a run are compared: the reference's outputs with the ranks' under the check's
declared output relation, and the localized module's value with the reference's.

A comparison is evidence of a discrepancy only at the outputs, compared under the relation the
check declares (or where a rank fails). The localized module's value is compared too, for the
report: only where every rank holds a value of the reference's shape, and only when it is neither
the reference's value on every rank, nor its sum over the ranks (a partial sum), nor its maximum
over them (a partial max); a difference there alone shows no mistake (a correct program may hold
another value inside a module and make up for it after).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

# Relative error (to the largest reference magnitude) above which values count as different. The
# run is in float64 on small weights: equal programs agree to ~1e-14, real bugs differ by O(1).
RELATIVE_TOLERANCE = 1e-6
# A model whose kernels refuse float64 runs in float32, where equal programs agree to ~1e-6.
FLOAT32_TOLERANCE = 1e-4


def tolerance_of(dtype: torch.dtype) -> float:
    return RELATIVE_TOLERANCE if dtype == torch.float64 else FLOAT32_TOLERANCE


@dataclass
class Difference:
    where: str  # "output 0", or a module path
    max_abs: float
    max_rel: float
    note: str = ""
    tolerance: float = RELATIVE_TOLERANCE
    # False where a difference would not show a mistake (the ranks hold a shard of the value)
    comparable: bool = True

    @property
    def differs(self) -> bool:
        return self.comparable and not (self.max_rel <= self.tolerance)  # NaN differs


@dataclass
class Trial:
    """One run of the reference and the ranks: its weights, inputs and the worst errors seen."""

    seed: int
    inputs: str
    dtype: str
    max_rel: float | None  # the worst output error (None: not a number, e.g. a missing output)
    at_module_rel: float | None = None
    differs: bool = False
    note: str = ""


@dataclass
class NumericComparison:
    world_size: int
    configuration: str  # "full" or "quick"
    outputs: list[Difference] = field(default_factory=list)
    at_module: Difference | None = None
    inputs: str = "the example inputs"
    seed: int = 0
    dtype: str = "float64"
    tolerance: float = RELATIVE_TOLERANCE
    # a rank that fails on inputs the reference runs (an exception in its forward pass)
    failure: str = ""
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the run was made (a float32 fallback, ...)
    seconds: float = 0.0

    @property
    def differs(self) -> bool:
        """Real numbers show a difference: an output, or a rank that fails where the reference
        runs. The localized module's value is reported, never evidence on its own: a correct
        program may hold another value there by design (a row-parallel linear whose own bias is
        zero, the reference's bias added after the all-reduce), as long as its outputs agree."""
        return bool(self.failure) or any(d.differs for d in self.outputs)

    def trial(self) -> Trial:
        """This comparison as one trial of a witness."""
        finite = [d.max_rel for d in self.outputs if math.isfinite(d.max_rel)]
        worst = None if len(finite) < len(self.outputs) else max(finite, default=0.0)
        module = self.at_module.max_rel if self.at_module and math.isfinite(self.at_module.max_rel) else None
        return Trial(self.seed, self.inputs, self.dtype, worst, module, self.differs, self.failure)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: an error that is not a number (different shapes, missing values) is null."""

        def finite(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: finite(v) for k, v in value.items()}
            if isinstance(value, list):
                return [finite(v) for v in value]
            return value

        data = finite(asdict(self))
        if self.at_module is not None:  # for the report, which reads it without torch (describe.py)
            data["at_module"]["differs"] = self.at_module.differs
        return data


def difference(
    where: str, reference: torch.Tensor, candidate: torch.Tensor, note: str = "", tolerance: float = RELATIVE_TOLERANCE
) -> Difference:
    if reference.shape != candidate.shape:
        shapes = f"shape {list(candidate.shape)}, expected {list(reference.shape)}"
        return Difference(where, math.inf, math.inf, shapes, tolerance)
    reference = reference.to(torch.float64)
    error = (candidate.to(torch.float64) - reference).abs().max().item() if reference.numel() else 0.0
    scale = reference.abs().max().item() if reference.numel() else 0.0
    return Difference(where, error, error / max(scale, 1e-12), note, tolerance)


def _combine(reference: torch.Tensor, per_rank: list[torch.Tensor], relation: str) -> tuple[torch.Tensor, str]:
    """What the ranks hold together, under the declared output relation."""
    if relation == "partial":
        return torch.stack([t.to(torch.float64) for t in per_rank]).sum(0), "sum over ranks"
    if relation == "sharded" and any(t.shape != reference.shape for t in per_rank):
        for dim in range(reference.dim()):
            try:
                joined = torch.cat(per_rank, dim=dim)
            except RuntimeError:
                continue
            if joined.shape == reference.shape:
                return joined, f"concatenated along dim {dim}"
        return per_rank[0], "rank 0 (no dim along which the shards form the reference's shape)"
    return per_rank[0], "every rank"  # replicated (or a sharded output that every rank holds in full)


def _compare(
    where: str, reference: torch.Tensor, per_rank: list[torch.Tensor], relation: str, tolerance: float
) -> Difference:
    combined, how = _combine(reference, per_rank, relation)
    if how == "every rank":
        return _worst_rank(where, reference, per_rank, tolerance)
    return difference(where, reference, combined, how, tolerance)


def _worst_rank(where: str, reference: torch.Tensor, per_rank: list[torch.Tensor], tolerance: float) -> Difference:
    worst = max(
        (difference(where, reference, t, tolerance=tolerance) for t in per_rank), key=lambda d: (d.max_rel, d.max_abs)
    )
    worst.note = worst.note or "every rank holds it in full"
    return worst


def compare_module(where: str, reference: torch.Tensor, per_rank: list[torch.Tensor], tolerance: float) -> Difference:
    """The localized module's value on the ranks against the reference's. Evidence only where every
    rank holds the reference's shape; the closest of the readings "every rank holds it", "the ranks
    hold partial sums of it" and "the ranks hold partial maxima of it"."""
    if any(t.shape != reference.shape for t in per_rank):
        shapes = ", ".join(f"rank {r}: {list(t.shape)}" for r, t in enumerate(per_rank))
        note = f"each rank holds a part of it ({shapes}; the reference's is {list(reference.shape)})"
        return Difference(where, math.nan, math.nan, note, tolerance, comparable=False)
    stacked = torch.stack([t.to(torch.float64) for t in per_rank])
    readings = [
        _worst_rank(where, reference, per_rank, tolerance),
        difference(where, reference, stacked.sum(0), "as partial sums over the ranks", tolerance),
        difference(where, reference, stacked.amax(0), "as partial maxima over the ranks", tolerance),
    ]
    return min(readings, key=lambda d: math.inf if math.isnan(d.max_rel) else d.max_rel)


def compare_runs(
    reference_outputs: list[Any],
    rank_outputs: list[list[Any]],
    captured: dict[str, Any],
    world_size: int,
    output_relation: str,
    module_path: str,
    configuration: str,
    tolerance: float = RELATIVE_TOLERANCE,
) -> NumericComparison:
    """The errors of every rank's flattened outputs against the reference's under the declared
    output relation, and at `module_path` from the values `captured` under "reference" and
    "rank<r>" (the first call of that module)."""
    result = NumericComparison(world_size, configuration, tolerance=tolerance)
    if output_relation == "last-rank":  # a pipeline: the last stage returns the outputs
        rank_outputs, output_relation = rank_outputs[-1:], "replicated"
    for index, expected in enumerate(reference_outputs):
        if not isinstance(expected, torch.Tensor):
            continue
        per_rank = [outputs[index] if index < len(outputs) else None for outputs in rank_outputs]
        if any(not isinstance(t, torch.Tensor) for t in per_rank):
            missing = Difference(f"output {index}", math.inf, math.inf, "a rank returns no such output", tolerance)
            result.outputs.append(missing)
            continue
        result.outputs.append(_compare(f"output {index}", expected, per_rank, output_relation, tolerance))
    if module_path and "reference" in captured:
        per_rank = [captured.get(f"rank{r}") for r in range(world_size)]
        if all(isinstance(t, torch.Tensor) for t in per_rank):
            result.at_module = compare_module(module_path, captured["reference"], per_rank, tolerance)
        else:
            note = "the ranks have no module of that name"
            result.at_module = Difference(module_path, math.nan, math.nan, note, tolerance, comparable=False)
    return result
