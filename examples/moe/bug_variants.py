"""Realistic one-line mistakes in the mixture-of-experts example, each a complete project.

    python examples/moe/bug_variants.py OUTDIR [NAME ...]

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
PARALLEL = "moe_example/parallel.py"


@dataclass(frozen=True)
class MoEBug:
    name: str
    description: str
    check: str  # the check that finds it
    original: str  # the exact line (without indentation) in moe_example/parallel.py
    buggy: str  # its replacement
    world_sizes: tuple[int, ...] = (2, 4)

    def line_number(self, root: Path = HERE) -> int:
        """1-based line of the mistake (the same in the correct and the buggy file)."""
        lines = (root / PARALLEL).read_text().splitlines()
        matches = [i + 1 for i, line in enumerate(lines) if line.strip() in (self.original, self.buggy)]
        if len(matches) != 1:
            raise ValueError(f"{self.name}: expected one line matching {self.original!r}, found {len(matches)}")
        return matches[0]


VARIANTS: tuple[MoEBug, ...] = (
    MoEBug(
        "weights-paired-with-wrong-experts",
        "the routing weights [groups, tokens, top_k] are reshaped to choice-major order instead of "
        "transposed, so each slot is weighted with another (token, choice)'s weight",
        "moe-ep",
        "priority_weights = weights.transpose(1, 2)  # choice-major, as the slots are",
        "priority_weights = weights.reshape(mine, cfg.top_k, -1)  # choice-major, as the slots are",
    ),
    MoEBug(
        "shared-expert-reduced-twice",
        "the shared expert's partial sum is all-reduced on its own and then again with the routed output",
        "moe-tp",
        "shared = self.shared(tokens)",
        "shared = all_reduce(self.shared(tokens))",
    ),
    MoEBug(
        "combine-splits-swapped",
        "the combine all-to-all reuses the dispatch's split sizes instead of swapping them: with experts "
        "divided unevenly (4 ranks, 6 experts) ranks send and expect different numbers of rows",
        "moe-ep",
        "dist.all_to_all_single(expert_out, sent, self.per_rank, [self.n_local] * ranks)",
        "dist.all_to_all_single(expert_out, sent, [self.n_local] * ranks, self.per_rank)",
        world_sizes=(4,),
    ),
)


def variant(name: str) -> MoEBug:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise KeyError(name)


def materialize(bug: MoEBug, destination: Path) -> Path:
    """A copy of the example with the mistake in it."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(HERE, destination, ignore=shutil.ignore_patterns("__pycache__", "bug_variants.py"))
    target = destination / PARALLEL
    lines = target.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == bug.original]
    if len(hits) != 1:
        raise ValueError(f"{bug.name}: expected one line {bug.original!r} in {PARALLEL}, found {len(hits)}")
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
