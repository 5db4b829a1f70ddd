"""What the numeric witness of a gradients check costs, and how closely proven gradients agree.

For every check of examples/gradients at 2 and 4 ranks: the training steps of the reference and
of every rank (threads on torch's threaded process group, float64, random weights, the example
inputs), the steps' outputs and every reference gradient compared with the ranks'. Prints a
Markdown table for BENCHMARKS.md (median witness time; the largest relative error over the
outputs and gradients, which for a verified check is rounding).

    python bench/bench_gradient_witness.py [--runs 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

import torch

from shardproof.capture.program import CheckCapture
from shardproof.config import load_project
from shardproof.witness.run import compare_gradients_numerically

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gradients"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    project = load_project(EXAMPLE)
    machine = platform.processor() or platform.machine()
    print(f"Machine: {machine}, Python {platform.python_version()}, torch {torch.__version__}.")
    print(f"Median of {args.runs} runs.\n")
    print("| check | world size | witness | gradients compared | largest relative error |")
    print("|---|---|---|---|---|")
    for check in project.checks:
        capture = CheckCapture(check, project)
        for world_size in (2, 4):
            roles = [rank.graph.gradient_roles for rank in capture.capture(world_size).ranks]
            runs = [compare_gradients_numerically(check, project, world_size, roles) for _ in range(args.runs)]
            last = runs[-1]
            gradients = sum(d.where.startswith("gradient of ") for d in last.outputs)
            worst = max(d.max_rel for d in last.outputs)
            seconds = statistics.median(r.seconds for r in runs)
            print(f"| {check.name} | {world_size} | {seconds:.2f} s | {gradients} | {worst:.1e} |")


if __name__ == "__main__":
    main()
