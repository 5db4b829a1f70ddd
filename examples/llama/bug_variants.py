"""Realistic one-line mistakes in the tensor-parallel example, each a complete project.

    python examples/llama/bug_variants.py OUTDIR [NAME ...]

writes OUTDIR/<name>/ (a copy of this example with the one line changed, and its check
declaration). `shardproof verify --project OUTDIR/<name>` then reports the mistake. The tests
use the same variants and assert the file and line of each report.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class BugVariant:
    name: str
    description: str
    file: str  # relative to the example root
    original: str  # the exact line (without indentation) in the correct code
    buggy: str  # its replacement
    world_sizes: tuple[int, ...]  # where the mistake changes the result without a crash
    kind: str  # the discrepancy kind shardproof should report
    parallel: str = "llama_example.tp:parallelize"  # the parallel model the mistake is in
    reference: str = "llama_example.model:build"  # and its reference (`<name>_quick` for the quick check)
    inputs: str = "llama_example.model:example_inputs"

    @property
    def check_name(self) -> str:
        style = self.parallel.split(".")[-1].split(":")[0]  # tp, sp or loss
        return f"llama-{style}-{self.name.removeprefix(style + '-')}"

    def line_number(self, root: Path = HERE) -> int:
        """1-based line of the mistake (the same in the correct and the buggy file)."""
        lines = (root / self.file).read_text().splitlines()
        matches = [i + 1 for i, line in enumerate(lines) if line.strip() in (self.original, self.buggy)]
        if len(matches) != 1:
            raise ValueError(f"{self.name}: expected one line matching {self.original!r}, found {len(matches)}")
        return matches[0]


VARIANTS: tuple[BugVariant, ...] = (
    BugVariant(
        "missing-all-reduce",
        "the row-parallel attention output projection returns its partial sum unreduced",
        "llama_example/tp.py",
        "return reduce_from_tp(F.linear(x, self.weight)) + self.bias",
        "return F.linear(x, self.weight) + self.bias",
        (2, 4, 8),
        "missing-reduction",
    ),
    BugVariant(
        "all-reduce-twice",
        "the row-parallel output is all-reduced twice, multiplying it by the world size",
        "llama_example/tp.py",
        "return reduce_from_tp(F.linear(x, self.weight)) + self.bias",
        "return reduce_from_tp(reduce_from_tp(F.linear(x, self.weight))) + self.bias",
        (2, 4, 8),
        "duplicate-reduction",
    ),
    BugVariant(
        "bias-before-reduction",
        "every rank adds the full bias before the all-reduce",
        "llama_example/tp.py",
        "return reduce_from_tp(F.linear(x, self.weight)) + self.bias",
        "return reduce_from_tp(F.linear(x, self.weight) + self.bias)",
        (2, 4, 8),
        "bias-before-reduction",
    ),
    BugVariant(
        "gather-wrong-dim",
        "the LM-head shards are concatenated along the sequence instead of the vocabulary",
        "llama_example/tp.py",
        "return torch.cat(gathered.chunk(world_size, dim=0), dim=-1)",
        "return torch.cat(gathered.chunk(world_size, dim=0), dim=1)",
        (2, 4, 8),
        "wrong-layout",
    ),
    BugVariant(
        "gate-up-swapped",
        "the packed gate/up shard is concatenated as [up, gate] but split as [gate, up]",
        "llama_example/tp.py",
        "ffn.w_gate_up.weight.copy_(torch.cat([gate, up]))",
        "ffn.w_gate_up.weight.copy_(torch.cat([up, gate]))",
        (2, 4, 8),
        "shard-order",
    ),
    BugVariant(
        "kv-heads-split",
        "key/value heads are dealt out round-robin as if split, although ranks sharing a "
        "key/value head must hold the same replica",
        "llama_example/tp.py",
        "k_local = k_rows.narrow(0, (rank * cfg.n_kv_heads // world_size) * hd, kv_rows)",
        "k_local = k_rows.narrow(0, (rank % cfg.n_kv_heads) * hd, kv_rows)",
        (4, 8),
        "wrong-shard",
    ),
    BugVariant(
        "rotary-head-offset",
        "rotary embeddings start at the rank's global head index inside its local heads",
        "llama_example/tp.py",
        "qkv = rotate_heads(qkv, cos, sin, start=0, count=self.n_local_heads + self.n_local_kv_heads)",
        "qkv = rotate_heads(qkv, cos, sin, start=self.rank * self.n_local_heads, count=self.n_local_heads "
        "+ self.n_local_kv_heads)",
        (2, 4, 8),
        "wrong-shard",
    ),
    BugVariant(
        "bias-share-scaled-twice",
        "the bias share, already divided by the world size when loaded, is divided again",
        "llama_example/tp.py",
        "return reduce_from_tp(F.linear(x, self.weight, self.bias))",
        "return reduce_from_tp(F.linear(x, self.weight, self.bias / self.world_size))",
        (2, 4, 8),
        "wrong-scaling",
    ),
    BugVariant(
        "fused-qkv-layout",
        "the packed QKV weight is sharded as one matrix instead of per q/k/v part",
        "llama_example/tp.py",
        "attn.wqkv.weight.copy_(torch.cat([q_local, k_local, v_local]))",
        "attn.wqkv.weight.copy_(shard(ref.wqkv.weight, 0, rank, world_size))",
        (2,),
        "wrong-shard",
    ),
    BugVariant(
        "embedding-mask-off-by-one",
        "the vocab-parallel mask drops the first token id of every rank's range",
        "llama_example/tp.py",
        "outside = (tokens < self.vocab_start) | (tokens >= self.vocab_end)",
        "outside = (tokens <= self.vocab_start) | (tokens >= self.vocab_end)",
        (2, 4, 8),
        "wrong-shard",
    ),
    BugVariant(
        "every-rank-shard-zero",
        "every rank loads the first shard of the attention output projection",
        "llama_example/tp.py",
        "attn.wo.weight.copy_(shard(ref.wo.weight, 1, rank, world_size))",
        "attn.wo.weight.copy_(shard(ref.wo.weight, 1, 0, world_size))",
        (2, 4, 8),
        "wrong-shard",
    ),
)

# Mistakes in the sequence-parallel version (sp.py, whose collectives act on the sequence dim of
# a batch-first layout). Each is caught, confirmed numerically and reported at its line.
SEQUENCE_PARALLEL_VARIANTS: tuple[BugVariant, ...] = (
    BugVariant(
        "sp-gather-as-reshape",
        "the all-gathered sequence shards (stacked along dim 0) are reshaped instead of moved to the sequence dim",
        "llama_example/sp.py",
        "return torch.cat(gathered.chunk(world_size, dim=0), dim=1)",
        "return gathered.reshape(x.shape[0], -1, x.shape[2])",
        (2, 4),
        "not-equivalent",
        parallel="llama_example.sp:parallelize",
    ),
    BugVariant(
        "sp-scatter-without-regroup",
        "the partial sums are reduce-scattered along dim 0 (the batch) without grouping the sequence chunks by rank",
        "llama_example/sp.py",
        "by_rank = torch.cat(x.chunk(world_size, dim=1), dim=0).contiguous()",
        "by_rank = x.reshape(world_size * x.shape[0], -1, x.shape[2]).contiguous()",
        (2, 4),
        "wrong-layout",
        parallel="llama_example.sp:parallelize",
    ),
    BugVariant(
        "sp-missing-final-gather",
        "the last norm's sequence shards go to the output projection without being gathered",
        "llama_example/sp.py",
        "return self.output(gather_sequence(self.norm(h)))",
        "return self.output(self.norm(h))",
        (2, 4),
        "wrong-layout",
        parallel="llama_example.sp:parallelize",
    ),
)


# Mistakes in the vocab-parallel loss (loss.py: cross entropy with label smoothing on logits
# sharded over the vocabulary). Each is caught, confirmed numerically and reported at its line.
_LOSS = {
    "parallel": "llama_example.loss:parallelize",
    "reference": "llama_example.model:build_with_loss",
    "inputs": "llama_example.model:example_inputs_with_targets",
}
LOSS_VARIANTS: tuple[BugVariant, ...] = (
    BugVariant(
        "loss-smoothing-local-vocab",
        "label smoothing averages the shifted logits over this rank's vocabulary size instead of the whole",
        "llama_example/loss.py",
        "uniform = torch.log(sum_exp) - sum_logits / vocab_size",
        "uniform = torch.log(sum_exp) - sum_logits / local_size",
        (2, 4),
        "wrong-constant",
        **_LOSS,
    ),
    BugVariant(
        "loss-target-mask-off-by-one",
        "the target mask drops the first class of every rank's shard: no rank picks that target's logit",
        "llama_example/loss.py",
        "outside = (targets < vocab_start) | (targets >= vocab_end)",
        "outside = (targets <= vocab_start) | (targets >= vocab_end)",
        (2, 4),
        "wrong-shard",
        **_LOSS,
    ),
    BugVariant(
        "loss-missing-max-reduction",
        "each rank subtracts its own shard's max instead of the max over the whole vocabulary",
        "llama_example/loss.py",
        "logits_max = all_reduce_max(logits.amax(dim=-1))",
        "logits_max = logits.amax(dim=-1)",
        (2, 4),
        "missing-reduction",
        **_LOSS,
    ),
)


def variant(name: str) -> BugVariant:
    for v in VARIANTS + SEQUENCE_PARALLEL_VARIANTS + LOSS_VARIANTS:
        if v.name == name:
            return v
    raise KeyError(name)


PYPROJECT = """[project]
name = "llama-example-{name}"
version = "0.1.0"
requires-python = ">=3.11"

[tool.shardproof]
python-path = ["."]

[[tool.shardproof.check]]
name = "{check}"
reference = "{reference}"
parallel = "{parallel}"
inputs = "{inputs}"
world-sizes = [{world_sizes}]
outputs = "replicated"

[tool.shardproof.check.quick]
reference = "{reference}_quick"
inputs = "{inputs}_quick"
world-sizes = [{quick_world_size}]
"""


def materialize(bug: BugVariant, dest: Path) -> Path:
    """Write the example with `bug` applied to dest; returns dest."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(HERE / "llama_example", dest / "llama_example", ignore=shutil.ignore_patterns("__pycache__"))
    target = dest / bug.file
    lines = target.read_text().splitlines(keepends=True)
    index = bug.line_number(HERE) - 1
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    lines[index] = indent + bug.buggy + "\n"
    target.write_text("".join(lines))
    sizes = ", ".join(str(w) for w in bug.world_sizes)
    quick = min(bug.world_sizes)
    (dest / "pyproject.toml").write_text(
        PYPROJECT.format(
            name=bug.name,
            check=bug.check_name,
            parallel=bug.parallel,
            reference=bug.reference,
            inputs=bug.inputs,
            world_sizes=sizes,
            quick_world_size=quick,
        )
    )
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("names", nargs="*", help="variants to write (default: all)")
    args = parser.parse_args(argv)
    every = VARIANTS + SEQUENCE_PARALLEL_VARIANTS + LOSS_VARIANTS
    chosen = [variant(n) for n in args.names] if args.names else list(every)
    for bug in chosen:
        path = materialize(bug, args.outdir / bug.name)
        print(f"{bug.name:28} {path}  ({bug.file}:{bug.line_number()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
