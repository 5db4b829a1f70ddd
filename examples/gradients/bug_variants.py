"""Realistic one-line gradient mistakes in the gradients example, each a complete project.

    python examples/gradients/bug_variants.py OUTDIR [NAME ...]

writes OUTDIR/<name>/ (a copy of this example with the one line changed). The tests verify the
variant's check and assert the file and line of the report.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class GradientBug:
    name: str
    description: str
    check: str  # the check that finds it
    file: str  # relative to the example root
    original: str  # the exact line (without indentation) in the correct code
    buggy: str  # its replacement
    reported_at: str  # the line (without indentation) the report points at, in `reported_file`
    reported_file: str
    world_sizes: tuple[int, ...] = (2, 4)

    def line_number(self, root: Path = HERE) -> int:
        """1-based line of the report (the same in the correct and the buggy file)."""
        lines = (root / self.reported_file).read_text().splitlines()
        wanted = {self.reported_at} | ({self.buggy} if self.reported_at == self.original else set())
        matches = [i + 1 for i, line in enumerate(lines) if line.strip() in wanted]
        if len(matches) != 1:
            raise ValueError(f"{self.name}: expected one line matching {self.reported_at!r}, found {len(matches)}")
        return matches[0]


VARIANTS: tuple[GradientBug, ...] = (
    GradientBug(
        "partial-input-gradient",
        "copying into the tensor-parallel region passes the gradient through instead of summing the ranks' "
        "(every gradient below the first MLP is a partial sum)",
        "grads-tp",
        "grad_example/parallel.py",
        "return _all_reduce(grad)",
        "return grad",
        "x = self.norm(x)",  # the final norm: the first to receive a partial gradient
        "grad_example/parallel.py",
    ),
    GradientBug(
        "final-norm-gradient-not-reduced",
        "after backward only the blocks' norm weights are all-reduced, not the final norm's "
        "(under sequence parallelism each rank's gradient covers its own tokens)",
        "grads-sp",
        "grad_example/parallel.py",
        'if name.endswith("norm.weight") and parameter.grad is not None:',
        'if name.startswith("model.layers.") and name.endswith("norm.weight") and parameter.grad is not None:',
        "x = self.norm(x)",
        "grad_example/parallel.py",
    ),
    GradientBug(
        "frozen-head-stops-gradients",
        "the frozen output head is applied to a detached input, so no gradient reaches the layers below it",
        "grads-tp",
        "grad_example/parallel.py",
        "return GatherFromTensorParallel.apply(self.head(x))",
        "return GatherFromTensorParallel.apply(self.head(x.detach()))",
        "return GatherFromTensorParallel.apply(self.head(x))",
        "grad_example/parallel.py",
    ),
    GradientBug(
        "gradients-summed-not-averaged",
        "the data-parallel gradients are all-reduced but not divided by the number of ranks "
        "(each rank's loss is already the mean over its own items)",
        "grads-dp",
        "grad_example/parallel.py",
        "parameter.grad.div_(world_size)",
        "pass",
        "dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)",
        "grad_example/parallel.py",
    ),
    GradientBug(
        "micro-batch-means-summed",
        "each micro-batch's loss is its own mean and the accumulated gradients add the means up, "
        "instead of dividing each micro-batch's sum by the number of items in the step",
        "grads-accum",
        "grad_example/parallel.py",
        "loss = (logits - micro_targets).pow(2).sum() / items",
        "loss = (logits - micro_targets).pow(2).mean()",
        "loss = (logits - micro_targets).pow(2).sum() / items",
        "grad_example/parallel.py",
    ),
)


def variant(name: str) -> GradientBug:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise KeyError(name)


def materialize(bug: GradientBug, destination: Path) -> Path:
    """A copy of the example with the mistake in it."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(HERE, destination, ignore=shutil.ignore_patterns("__pycache__", "bug_variants.py"))
    target = destination / bug.file
    text = target.read_text()
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == bug.original]
    if len(hits) != 1:
        raise ValueError(f"{bug.name}: expected one line {bug.original!r} in {bug.file}, found {len(hits)}")
    line = lines[hits[0]]
    lines[hits[0]] = line[: len(line) - len(line.lstrip())] + bug.buggy + "\n"
    target.write_text("".join(lines))
    return destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    for bug in VARIANTS:
        if not args.names or bug.name in args.names:
            materialize(bug, args.outdir / bug.name)
            print(f"{bug.name}: {args.outdir / bug.name} (check {bug.check})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
