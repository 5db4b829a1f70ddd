"""Realistic one-line mistakes in the DeepSpeed AutoTP example, each a complete project.

    python examples/deepspeed_autotp/bug_variants.py OUTDIR [NAME ...]

writes OUTDIR/<name>/ (a copy of this example with the one line changed). `shardproof verify
--project OUTDIR/<name>` then reports the mistake at that line. The tests use the same variants
and assert the file, the line and the kind of each report, and that the numbers confirm it.

Most one-line changes to an AutoTP policy fail loudly (a row-parallel layer planned column-wise,
a pattern that misses a layer: the shapes no longer fit). These do not: the model runs and
returns wrong numbers.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARALLEL = "ds_autotp/parallel.py"


@dataclass(frozen=True)
class AutoTPBug:
    name: str
    description: str
    check: str  # the check that finds it
    original: str  # the exact line (without indentation) in ds_autotp/parallel.py
    buggy: str  # its replacement
    kind: str  # the discrepancy kind shardproof reports
    # Where shardproof reports it (file relative to the example root, and that line's code), when
    # that is not the changed line: the producer of an unreduced partial sum is the line before.
    site: tuple[str, str] | None = None
    world_sizes: tuple[int, ...] = (2, 4)
    file: str = PARALLEL  # relative to the example root

    @property
    def check_name(self) -> str:
        """The check's name in the variant's project (its own name: results are cached by declaration)."""
        return f"{self.check}-{self.name}"

    def line_number(self, root: Path = HERE) -> int:
        """1-based line of the mistake (the same in the correct and the buggy file)."""
        return _line(root / self.file, (self.original, self.buggy), self.name)

    def site_file_and_line(self, root: Path = HERE) -> tuple[Path, int]:
        """The file and 1-based line shardproof reports the mistake at."""
        if self.site is None:
            return root / self.file, self.line_number(root)
        file, code = self.site
        return root / file, _line(root / file, (code,), self.name)


def _line(path: Path, texts: tuple[str, ...], name: str) -> int:
    matches = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if line.strip() in texts]
    if len(matches) != 1:
        raise ValueError(f"{name}: expected one line matching {texts[0]!r} in {path.name}, found {len(matches)}")
    return matches[0]


VARIANTS: tuple[AutoTPBug, ...] = (
    AutoTPBug(
        "lm-head-not-gathered",
        "the LM head's layer spec leaves out `gather_output`: AutoTP makes it a column-parallel LinearLayer "
        "whose output stays sharded, so every rank returns its slice of the vocabulary's logits",
        "deepspeed-autotp",
        '{"patterns": [r".*lm_head\\.weight$"], "partition_type": "column", "gather_output": True},',
        '{"patterns": [r".*lm_head\\.weight$"], "partition_type": "column"},',
        "wrong-layout",
        # Reported at the user's call into the model (the LM head's LinearLayer is inside it, shown as
        # related information), not yet at the layer spec that made it.
        site=("ds_autotp/model.py", "return self.model(input_ids=input_ids, use_cache=False).logits"),
    ),
    AutoTPBug(
        "down-proj-not-reduced",
        "the hand-written LinearAllreduce subclass overrides forward and never calls its all-reduce: "
        "every rank adds the bias to its partial sum of down_proj and goes on with it",
        "deepspeed-autotp-fp32-reduce",
        "return add_bias(self.all_reduce(partial), self.bias)",
        "return add_bias(partial, self.bias)",
        "missing-reduction",
        site=(PARALLEL, "partial = torch.matmul(input, self.weight.transpose(-1, -2))"),
    ),
    AutoTPBug(
        "down-proj-bias-before-reduction",
        "the hand-written LinearAllreduce subclass adds the (replicated) bias before its all-reduce: "
        "the sum counts it once per rank",
        "deepspeed-autotp-fp32-reduce",
        "return add_bias(self.all_reduce(partial), self.bias)",
        "return self.all_reduce(add_bias(partial, self.bias))",
        "bias-before-reduction",
    ),
)


def variant(name: str) -> AutoTPBug:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise KeyError(name)


def materialize(bug: AutoTPBug, destination: Path) -> Path:
    """A copy of the example with the mistake in it."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(HERE, destination, ignore=shutil.ignore_patterns("__pycache__", "bug_variants.py"))
    target = destination / bug.file
    lines = target.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == bug.original]
    if len(hits) != 1:
        raise ValueError(f"{bug.name}: expected one line {bug.original!r} in {bug.file}, found {len(hits)}")
    line = lines[hits[0]]
    lines[hits[0]] = line[: len(line) - len(line.lstrip())] + bug.buggy + "\n"
    target.write_text("".join(lines))
    pyproject = destination / "pyproject.toml"
    declaration = pyproject.read_text()
    assert declaration.count(f'name = "{bug.check}"\n') == 1, bug.check
    pyproject.write_text(declaration.replace(f'name = "{bug.check}"\n', f'name = "{bug.check_name}"\n'))
    return destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    for bug in VARIANTS:
        if not args.names or bug.name in args.names:
            materialize(bug, args.outdir / bug.name)
            print(f"{bug.name}: {args.outdir / bug.name} (check {bug.check_name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
