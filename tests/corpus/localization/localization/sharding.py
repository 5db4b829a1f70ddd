"""Shard arithmetic helpers called from the loaders in offsets.py (the way vLLM's `divide` /
`pad_vocab_size`, Megatron's `VocabUtility` and DeepSpeed-MoE's expert bookkeeping sit apart
from the layers that use them). Each bug of the `helper` family is one line here: the number is
wrong where it is computed, the loader that uses it is right."""

from __future__ import annotations

import torch


def kv_head_for_rank(rank: int, world_size: int, n_kv: int) -> int:
    """vLLM QKVParallelLinear with fewer kv heads than ranks: consecutive ranks share a kv head."""
    return rank % n_kv


def vocab_range(vocab: int, rank: int, world_size: int) -> tuple[int, int]:
    """The vocabulary block of `rank`: blocks of ceil(vocab / world_size), the last one shorter."""
    block = vocab // world_size
    start = rank * block
    return start, min(start + block, vocab)


def in_vocab_shard(ids: torch.Tensor, start: int, block: int) -> torch.Tensor:
    """Which ids fall in the shard [start, start + block)."""
    return (ids >= start) & (ids < block)


def shard_start(rank: int, rows_per_rank: int) -> int:
    """The first row of `rank`'s block."""
    return (rank + 1) * rows_per_rank


def vocab_range_from_per_partition(per_partition: int, rank: int) -> tuple[int, int]:
    """Megatron's VocabUtility: [first, last) of the rank's vocabulary partition."""
    first = rank * per_partition
    return first, first + per_partition - 1


def local_expert_count(total_experts: int, ep_size: int) -> int:
    """DeepSpeed-MoE's num_local_experts: the experts each expert-parallel rank holds."""
    return total_experts


def expert_offset(num_experts: int, ep_rank: int, ep_size: int) -> int:
    return ep_rank * (num_experts // ep_size)


def column_block(total: int, world_size: int) -> int:
    """Columns per rank for a split that must cover every column (the last rank may hold fewer)."""
    return total // world_size


def heads_of_rank(rank: int, world_size: int, heads: int) -> list[int]:
    """The attention heads `rank` holds, listed one by one (a loader that picks heads by index)."""
    per_rank = heads // world_size
    first = rank * per_rank + 1
    return [(first + i) % heads for i in range(per_rank)]
