"""Static verdicts against real numbers on every bundled example, and what a witness costs.

Two tables for BENCHMARKS.md:

1. Every bug variant of every bundled example (the Llama example's tensor-parallel, sequence-
   parallel and loss variants, the library examples' one-line mistakes, the mixture-of-experts
   and gradients variants) at each world size where it changes the result: the verdict, the
   witness status, how many trials ran until the numbers differed, and the witness time. Every
   variant must stay a `discrepancy` confirmed by numbers: a confirmed bug turned `unproven` is a
   regression of the witness.
2. Every correct check of those examples: the witness's full set of trials (three seeds of random
   weights, each on every input it chooses) against one seed, i.e. what the extra trials cost a
   finding whose numbers agree (the runs a witness makes before it says "unproven").

    python bench/bench_witness.py [--runs 3] [--only llama|libraries|moe|gradients]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import realworld_variants  # noqa: E402

from shardproof.config import Project, load_project  # noqa: E402
from shardproof.pipeline import verify_check  # noqa: E402
from shardproof.verify.sandbox import Sandbox  # noqa: E402
from shardproof.witness.run import compare_numerically  # noqa: E402


def _variants_module(example: str) -> ModuleType:
    """An example's bug_variants.py (each example has its own, under the same name)."""
    path = ROOT / "examples" / example / "bug_variants.py"
    spec = importlib.util.spec_from_file_location(f"bug_variants_{example}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _bugs(group: str, tmp: Path) -> list[tuple[str, Project, str, tuple[int, ...]]]:
    """(name, project, check name, world sizes) of every bug variant of a group."""
    out = []
    if group == "llama":
        module = _variants_module("llama")
        for bug in module.VARIANTS + module.SEQUENCE_PARALLEL_VARIANTS + module.LOSS_VARIANTS:
            project = load_project(module.materialize(bug, tmp / bug.name))
            out.append((bug.name, project, project.checks[0].name, bug.world_sizes))
    elif group == "libraries":
        for bug in realworld_variants.VARIANTS:
            project = load_project(bug.materialize(tmp / bug.name))
            out.append((bug.name, project, bug.check, (2, 4)))
    else:
        module = _variants_module(group)
        for bug in module.VARIANTS:
            project = load_project(module.materialize(bug, tmp / bug.name))
            check = getattr(bug, "check", None) or project.checks[0].name
            out.append((bug.name, project, check, bug.world_sizes))
    return out


EXAMPLES = {
    "llama": ["llama", "llama_loss"],
    "libraries": ["fairscale_llama", "megatron_gpt", "llama_models_meta", "dtensor_llama", "hf_llama"],
    "moe": ["moe"],
    "gradients": ["gradients"],
}


def _witness_of(outcome: Any) -> dict[str, Any]:
    findings = outcome.discrepancies or outcome.unproven
    return (findings[0].witness or {}) if findings else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=list(EXAMPLES), help="one group of examples")
    args = parser.parse_args()
    groups = [args.only] if args.only else list(EXAMPLES)
    bug_rows: list[tuple[str, int, str, str, int, float]] = []
    correct_rows: list[tuple[str, int, str, int, float, float]] = []
    with Sandbox(8192) as sandbox, tempfile.TemporaryDirectory() as tmp:
        for group in groups:
            for name, project, check_name, world_sizes in _bugs(group, Path(tmp) / group):
                check = project.check(check_name)
                for world_size in world_sizes:
                    times, status, trials, verdict = [], "none", 0, ""
                    for _ in range(args.runs):
                        (outcome,) = verify_check(check, project, [world_size], sandbox).results
                        times.append(outcome.seconds.get("witness", 0.0))
                        witness = _witness_of(outcome)
                        status, trials, verdict = (
                            witness.get("status", "none"),
                            len(witness.get("trials") or []),
                            outcome.verdict,
                        )
                    bug_rows.append((name, world_size, verdict, status, trials, statistics.median(times)))
            if group == "gradients":
                continue  # their witness runs the training steps once (bench_gradient_witness.py)
            for example in EXAMPLES[group]:
                project = load_project(ROOT / "examples" / example)
                for check in project.checks:
                    if check.gradients is not None:
                        continue
                    for outcome in verify_check(check, project, None, sandbox, numeric_witness=False).results:
                        full, one = [], []
                        for _ in range(args.runs):
                            start = time.perf_counter()
                            numbers = compare_numerically(check, project, outcome.world_size)
                            full.append(time.perf_counter() - start)
                            start = time.perf_counter()
                            compare_numerically(check, project, outcome.world_size, seeds=(0,))
                            one.append(time.perf_counter() - start)
                        correct_rows.append(
                            (
                                check.name,
                                outcome.world_size,
                                "differs" if numbers.differs else "agree",
                                len(numbers.trials),
                                statistics.median(full),
                                statistics.median(one),
                            )
                        )
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, runs: {args.runs}")
    print()
    print("| bug variant | world size | verdict | witness | trials run | witness time (median) |")
    print("|---|---|---|---|---|---|")
    for name, world_size, verdict, status, trials, seconds in bug_rows:
        print(f"| {name} | {world_size} | {verdict} | {status} | {trials} | {seconds:.2f} s |")
    confirmed = sum(status == "confirmed" for *_, status, _, _ in bug_rows)
    turned = [f"{n}@{w}" for n, w, verdict, *_ in bug_rows if verdict != "discrepancy"]
    print()
    print(f"bug variants confirmed: {confirmed} of {len(bug_rows)}; not a discrepancy: {turned or 'none'}")
    if correct_rows:
        print()
        print("| correct check | world size | numbers | trials | all trials (median) | one seed (median) | ratio |")
        print("|---|---|---|---|---|---|---|")
        for name, world_size, numeric, trials, full, one in correct_rows:
            ratio = full / one if one else float("nan")
            print(f"| {name} | {world_size} | {numeric} | {trials} | {full:.2f} s | {one:.2f} s | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
