"""Realistic one-line mistakes in the real-world examples (fairscale, Megatron-core, DTensor plans,
a user's override of Meta's Llama attention, Hugging Face tp_plan entries).

Each variant is the example with one line changed; the tests assert that shardproof reports it
at that line, in the user's model (never inside the library).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class BugVariant:
    example: str  # directory under examples/
    check: str
    name: str
    description: str
    file: str  # relative to the example root
    original: str  # the exact line (without indentation) in the correct code
    buggy: str  # its replacement
    kind: str  # the discrepancy kind shardproof reports

    def line_number(self, root: Path) -> int:
        lines = (root / self.file).read_text().splitlines()
        matches = [i + 1 for i, line in enumerate(lines) if line.strip() in (self.original, self.buggy)]
        if len(matches) != 1:
            raise ValueError(f"{self.name}: expected one line matching {self.original!r}, found {len(matches)}")
        return matches[0]

    def materialize(self, destination: Path) -> Path:
        """A copy of the example with the variant's line changed."""
        shutil.copytree(EXAMPLES / self.example, destination, ignore=shutil.ignore_patterns("__pycache__"))
        source = destination / self.file
        lines = source.read_text().splitlines(keepends=True)
        changed = 0
        for index, line in enumerate(lines):
            if line.strip() == self.original:
                indent = line[: len(line) - len(line.lstrip())]
                lines[index] = indent + self.buggy + "\n"
                changed += 1
        if changed != 1:
            raise ValueError(f"{self.name}: the line {self.original!r} occurs {changed} times")
        source.write_text("".join(lines))
        return destination


VARIANTS: tuple[BugVariant, ...] = (
    BugVariant(
        "fairscale_llama",
        "fairscale-llama3",
        "fairscale-copy-instead-of-reduce",
        "fairscale's f and g mixed up: the feed-forward partial sum goes through copy_to_model_parallel_region "
        "(the identity in forward) instead of reduce_from_model_parallel_region",
        "fs_llama/model.py",
        "return reduce_from_model_parallel_region(F.linear(hidden, self.w2.weight))",
        "return copy_to_model_parallel_region(F.linear(hidden, self.w2.weight))",
        "missing-reduction",
    ),
    BugVariant(
        "fairscale_llama",
        "fairscale-llama3",
        "fairscale-lm-head-not-gathered",
        "the column-parallel LM head's vocabulary shards are returned without the gather",
        "fs_llama/model.py",
        "return gather_from_model_parallel_region(self.output(self.norm(self.hidden_states(tokens))))",
        "return self.output(self.norm(self.hidden_states(tokens)))",
        "wrong-layout",
    ),
    BugVariant(
        "megatron_gpt",
        "megatron-tp",
        "megatron-qkv-wrong-layout",
        "the fused QKV output is split as [q | k | v] blocks, but Megatron's weight is laid out per head as "
        "[q, k, v]: right at world size 1, wrong once the weight is sharded by heads",
        "mg_gpt/model.py",
        "q, k, v = qkv.view(seq, batch, self.local_heads, 3 * self.head_dim).split(self.head_dim, dim=-1)",
        "q, k, v = qkv.view(seq, batch, 3, self.local_heads, self.head_dim).unbind(2)",
        "wrong-layout",
    ),
    BugVariant(
        "megatron_gpt",
        "megatron-sp",
        "megatron-logits-not-gathered",
        "the vocabulary-parallel logits are returned without the tensor-parallel gather",
        "mg_gpt/model.py",
        "return gather_from_tensor_model_parallel_region(self.sharded_logits(tokens)).transpose(0, 1)",
        "return self.sharded_logits(tokens).transpose(0, 1)",
        "wrong-layout",
    ),
    BugVariant(
        "dtensor_llama",
        "dtensor-tp",
        "dtensor-output-not-replicated",
        "the LM head's plan entry leaves the vocabulary shards as they are (no output_layouts=Replicate()): "
        "every rank returns its shard of the logits",
        "dt_llama/parallel.py",
        '"output": ColwiseParallel(output_layouts=Replicate()),',
        '"output": ColwiseParallel(),',
        "wrong-layout",
    ),
    BugVariant(
        "dtensor_llama",
        "dtensor-tp",
        "dtensor-gqa-keys-tiled",
        "grouped-query keys tiled (repeat) instead of interleaved: one function on one device, another once "
        "the heads are sharded, since each rank's query heads then meet other keys",
        "dt_llama/model.py",
        "k = k.repeat_interleave(self.repeats, dim=2)",
        "k = k.repeat(1, 1, self.repeats, 1)",
        "wrong-layout",
    ),
    BugVariant(
        "llama_models_meta",
        "llama-models-sdpa",
        "llama-models-keys-tiled",
        "the attention override repeats the cached key heads tiled instead of interleaved (repeat_kv): the "
        "same at world size 1, wrong once the heads are sharded",
        "meta_llama/check.py",
        "keys = repeat_kv(self.cache_k[:bsz, : start_pos + seqlen], self.n_rep)",
        "keys = self.cache_k[:bsz, : start_pos + seqlen].repeat(1, 1, self.n_rep, 1)",
        "wrong-layout",
    ),
    BugVariant(
        "llama_models_meta",
        "llama-models-sdpa",
        "llama-models-output-reduced-twice",
        "the attention override all-reduces the output of fairscale's RowParallelLinear, which already did",
        "meta_llama/check.py",
        "return self.wo(output)",
        "return reduce_from_model_parallel_region(self.wo(output))",
        "duplicate-reduction",
    ),
    BugVariant(
        "hf_llama",
        "hf-phi3-packed",
        "hf-packed-gate-up-sharded-as-one",
        "Phi-3's packed gate_up_proj planned `colwise` instead of `packed_colwise`: each rank holds a block "
        "of [gate; up] as if it were one matrix, and its chunk(2) pairs the wrong halves",
        "hf_tp/model.py",
        '"model.layers.*.mlp.gate_up_proj": "packed_colwise",',
        '"model.layers.*.mlp.gate_up_proj": "colwise",',
        "wrong-shard",
    ),
)
