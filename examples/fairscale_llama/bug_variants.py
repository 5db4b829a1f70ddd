"""Realistic one-line mistakes in the fairscale example, each a complete project.

    python examples/fairscale_llama/bug_variants.py OUTDIR

writes OUTDIR/<name>/ (a copy of this example with the one line changed). `shardproof verify
--project OUTDIR/<name>` then reports the mistake; the tests assert its file and line.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class BugVariant:
    name: str
    description: str
    original: str  # the exact line (without indentation) in fs_llama/model.py
    buggy: str  # its replacement
    kind: str  # the discrepancy kind shardproof reports
    file: str = "fs_llama/model.py"

    def line_number(self, root: Path = HERE) -> int:
        lines = (root / self.file).read_text().splitlines()
        matches = [i + 1 for i, line in enumerate(lines) if line.strip() in (self.original, self.buggy)]
        if len(matches) != 1:
            raise ValueError(f"{self.name}: expected one line matching {self.original!r}, found {len(matches)}")
        return matches[0]


VARIANTS: tuple[BugVariant, ...] = (
    BugVariant(
        "copy-instead-of-reduce",
        "fairscale's f and g mixed up: the feed-forward partial sum goes through copy_to_model_parallel_region "
        "(the identity in forward) instead of reduce_from_model_parallel_region",
        "return reduce_from_model_parallel_region(F.linear(hidden, self.w2.weight))",
        "return copy_to_model_parallel_region(F.linear(hidden, self.w2.weight))",
        "missing-reduction",
    ),
    BugVariant(
        "lm-head-not-gathered",
        "the column-parallel LM head's vocabulary shards are returned without the gather",
        "return gather_from_model_parallel_region(self.output(self.norm(h)))",
        "return self.output(self.norm(h))",
        "wrong-layout",
    ),
)


def materialize(variant: BugVariant, destination: Path) -> Path:
    """A copy of the example with the variant's line changed."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(HERE, destination, ignore=shutil.ignore_patterns("__pycache__", "bug_variants.py"))
    source = destination / variant.file
    text = source.read_text()
    lines = text.splitlines(keepends=True)
    changed = 0
    for index, line in enumerate(lines):
        if line.strip() == variant.original:
            indent = line[: len(line) - len(line.lstrip())]
            lines[index] = indent + variant.buggy + "\n"
            changed += 1
    if changed != 1:
        raise ValueError(f"{variant.name}: the line {variant.original!r} occurs {changed} times")
    source.write_text("".join(lines))
    return destination


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fairscale-bugs")
    for bug in VARIANTS:
        print(materialize(bug, out / bug.name))
