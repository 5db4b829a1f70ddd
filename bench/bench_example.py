"""Time capture and verification of the bundled Llama example at 2, 4 and 8 ranks.

    python bench/bench_example.py [--runs 3] [--world-sizes 2 4 8]

Prints a Markdown table (medians over the runs) with the machine it ran on; BENCHMARKS.md
records the results. Capture = tracing every rank (the reference is traced once per run and
reported on its own row); verification = encoding + egglog saturation in the sandbox, in parts
saturated at once unless --no-partition ("of which egglog saturation" adds up the parts' own
saturation times, which overlap).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {version('torch')}, "
        f"egglog {version('egglog')}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--project", type=Path, default=ROOT / "examples" / "llama")
    parser.add_argument("--check", default=None, help="the check to time (default: the project's first)")
    parser.add_argument("--no-partition", action="store_true", help="verify every world size whole")
    args = parser.parse_args()

    from shardproof.capture.program import CheckCapture
    from shardproof.config import load_project
    from shardproof.pipeline import verify_world_size
    from shardproof.verify.sandbox import Job, Sandbox

    project = load_project(args.project)
    check = project.check(args.check) if args.check else project.checks[0]
    reference: list[float] = []
    rows: dict[int, dict[str, list[float]]] = {w: {} for w in args.world_sizes}
    verdicts: dict[int, str] = {}
    with Sandbox(check.bounds.memory_mb) as sandbox:
        # start the children outside the timings
        sandbox.saturate_all([Job(['(let $warm (Leaf "warm"))'], 1, 10, 1000)] * sandbox.workers)
        for run in range(args.runs):
            capture = CheckCapture(check, project)
            start = time.perf_counter()
            capture.reference()
            reference.append(time.perf_counter() - start)
            for world_size in args.world_sizes:
                result = verify_world_size(
                    capture, check, world_size, sandbox, lambda *_: None, partition=not args.no_partition
                )
                verdicts[world_size] = result.verdict
                timings = rows[world_size]
                timings.setdefault("capture", []).append(result.seconds["capture"])
                seconds = result.seconds
                timings.setdefault("verify", []).append(seconds.get("relations", 0.0) + seconds["verification"])
                timings.setdefault("parts", []).append(result.stats.get("parts", 1))
                timings.setdefault("saturate", []).append(result.stats["saturation_seconds"])
                timings.setdefault("rows", []).append(result.stats["egraph_rows"])
                timings.setdefault("terms", []).append(result.stats["terms"])
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr)

    med = statistics.median
    base = med(rows[args.world_sizes[0]]["verify"])
    print(f"Machine: {machine()}. Median of {args.runs} runs.\n")
    print(f"Reference capture (once per check): {med(reference):.2f} s\n")
    print(
        "| world size | verdict | capture (all ranks) | capture per rank | verification | of which egglog "
        "saturation | verification vs. world size 2 | parts | largest e-graph (rows) | terms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in args.world_sizes:
        t = rows[w]
        print(
            f"| {w} | {verdicts[w]} | {med(t['capture']):.2f} s | {med(t['capture']) / w:.2f} s | "
            f"{med(t['verify']):.2f} s | {med(t['saturate']):.2f} s | {med(t['verify']) / base:.2f}x | "
            f"{int(med(t['parts']))} | {int(med(t['rows']))} | {int(med(t['terms']))} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
