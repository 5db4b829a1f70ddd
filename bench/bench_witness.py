"""Static verdicts against real numbers on every bundled example, and what a witness costs.

For every check of the Llama example (tensor parallel, sequence parallel) and of the library
examples (fairscale, Megatron-core: the same code at world size 1 as the reference) at each
declared world size, and every bug variant at each world size where it changes the result: the
static verdict, the numeric outcome (float64, random weights, the example inputs then boundary and
random inputs) and the witness time. A false positive is a
discrepancy the numbers do not confirm; a false negative is a proof of equality the numbers
contradict. Prints a Markdown table for BENCHMARKS.md.

    python bench/bench_witness.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llama"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import bug_variants  # noqa: E402
import realworld_variants  # noqa: E402

from shardproof.config import load_project  # noqa: E402
from shardproof.pipeline import verify_check  # noqa: E402
from shardproof.verify.sandbox import Sandbox  # noqa: E402
from shardproof.witness.run import compare_numerically  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["llama", "libraries"], help="one group of examples")
    args = parser.parse_args()
    rows: list[tuple[str, int, str, str, float, float]] = []
    false_positives = false_negatives = 0
    with Sandbox(8192) as sandbox, tempfile.TemporaryDirectory() as tmp:
        groups = {
            "llama": (
                ["llama"],
                [(bug, bug.world_sizes) for bug in bug_variants.VARIANTS + bug_variants.SEQUENCE_PARALLEL_VARIANTS],
            ),
            "libraries": (
                ["fairscale_llama", "megatron_gpt", "llama_models_meta", "dtensor_llama", "hf_llama"],
                [(bug, (2, 4)) for bug in realworld_variants.VARIANTS],
            ),
        }
        for group, (examples, variants) in groups.items():
            if args.only and args.only != group:
                continue
            correct = []
            for example in examples:
                project = load_project(ROOT / "examples" / example)
                correct += [
                    (f"{check.name} (correct)", project, check, outcome)
                    for check in project.checks
                    for outcome in verify_check(check, project, None, sandbox, numeric_witness=False).results
                ]
            for label, project, check, outcome in correct:
                times, worst = [], 0.0
                for _ in range(args.runs):
                    start = time.perf_counter()
                    numbers = compare_numerically(check, project, outcome.world_size)
                    times.append(time.perf_counter() - start)
                    worst = max(worst, max(o.max_rel for o in numbers.outputs))
                numeric = "differs" if numbers.differs else "equal"
                false_negatives += outcome.verdict == "verified" and numbers.differs
                rows.append((label, outcome.world_size, outcome.verdict, numeric, statistics.median(times), worst))
            for bug, world_sizes in variants:
                root = Path(tmp) / bug.name
                if isinstance(bug, bug_variants.BugVariant):
                    variant = load_project(bug_variants.materialize(bug, root))
                    check = variant.checks[0]
                else:
                    variant = load_project(bug.materialize(root))
                    check = variant.check(bug.check)
                for world_size in world_sizes:
                    times, status, error = [], "", 0.0
                    for _ in range(args.runs):
                        (outcome,) = verify_check(check, variant, [world_size], sandbox).results
                        times.append(outcome.seconds.get("witness", 0.0))
                        witness = outcome.discrepancies[0].witness if outcome.discrepancies else None
                        status = witness["status"] if witness else "none"
                        outputs = witness.get("outputs", []) if witness else []
                        error = (
                            max((o["max_rel"] if o["max_rel"] is not None else float("inf")) for o in outputs)
                            if outputs
                            else 0.0
                        )
                    numeric = "differs" if status == "confirmed" else "equal"
                    false_positives += outcome.verdict == "discrepancy" and status != "confirmed"
                    false_negatives += outcome.verdict == "verified"
                    rows.append((bug.name, world_size, outcome.verdict, numeric, statistics.median(times), error))
    print("| example | world size | static verdict | numbers | witness time (median) | max rel. error at the outputs |")
    print("|---|---|---|---|---|---|")
    for name, world_size, verdict, numeric, seconds, error in rows:
        shown = "shape differs" if error == float("inf") else f"{error:.2g}"
        print(f"| {name} | {world_size} | {verdict} | {numeric} | {seconds:.2f} s | {shown} |")
    print()
    print(f"false positives: {false_positives}, false negatives: {false_negatives}, cases: {len(rows)}")


if __name__ == "__main__":
    main()
