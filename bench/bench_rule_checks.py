"""Every rule of the library checked on concrete tensors: counts and time, per family.

Instances are drawn for every rank of worlds of 1 to 4 ranks, 3 trials each; rules with side
conditions are also given near misses. Prints a Markdown table for BENCHMARKS.md.

    python bench/bench_rule_checks.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from shardproof.rulecheck.harness import check_rule, parsed_rules
from shardproof.rulecheck.instances import INSTANCES, NEAR_MISSES
from shardproof.verify.rules import FAMILIES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rules = parsed_rules()
    totals: list[float] = []
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    times: dict[str, list[float]] = defaultdict(list)
    for run in range(args.runs):
        run_start = time.perf_counter()
        for parsed in rules:
            name = parsed.rule.name
            start = time.perf_counter()
            report = check_rule(parsed, INSTANCES[name], NEAR_MISSES.get(name))
            family = parsed.rule.family
            if run == 0:
                row = rows[family]
                row[0] += 1
                row[1] += parsed.guarded
                row[2] += report.instances
                row[3] += report.near_misses
                row[4] += not report.ok
            times[f"{family}/{run}"].append(time.perf_counter() - start)
        totals.append(time.perf_counter() - run_start)
    print("| family | rules | with side conditions | instances | near misses | failing | time (median) |")
    print("|---|---|---|---|---|---|---|")
    for family in FAMILIES:
        rules_n, guarded, instances, near, failing = rows[family]
        seconds = statistics.median(sum(times[f"{family}/{run}"]) for run in range(args.runs))
        print(f"| {family} | {rules_n} | {guarded} | {instances} | {near} | {failing} | {seconds:.2f} s |")
    count = [sum(row[i] for row in rows.values()) for i in range(5)]
    print(
        f"| all | {count[0]} | {count[1]} | {count[2]} | {count[3]} | {count[4]} | {statistics.median(totals):.2f} s |"
    )


if __name__ == "__main__":
    main()
