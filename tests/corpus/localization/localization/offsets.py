"""Loaders that take their shard bounds from sharding.py's helpers (family `helper`): each builder
here is right; the number it is given is not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum
from .models import EXPERTS, FFN, HEAD_DIM, HEADS, KV_HEADS, ODD_FFN, ODD_VOCAB, VOCAB, causal_attention
from .sharding import (
    column_block,
    expert_offset,
    heads_of_rank,
    in_vocab_shard,
    kv_head_for_rank,
    local_expert_count,
    shard_start,
    vocab_range,
    vocab_range_from_per_partition,
)


class ReplicatedKVAttention(nn.Module):
    """One q head per rank, its kv head chosen by `kv_head_for_rank` (replicated over ranks)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        q_rows = HEADS // world_size * HEAD_DIM
        kv = kv_head_for_rank(rank, world_size, KV_HEADS)
        self.q = nn.Parameter(ref.q_proj.weight[rank * q_rows : (rank + 1) * q_rows].clone())
        self.k = nn.Parameter(ref.k_proj.weight[kv * HEAD_DIM : (kv + 1) * HEAD_DIM].clone())
        self.v = nn.Parameter(ref.v_proj.weight[kv * HEAD_DIM : (kv + 1) * HEAD_DIM].clone())
        self.o = nn.Parameter(ref.o_proj.weight[:, rank * q_rows : (rank + 1) * q_rows].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM) for w in (self.q, self.k, self.v))
        return all_reduce_sum(F.linear(causal_attention(q, k, v), self.o))


def kv_head_modulo(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ReplicatedKVAttention(ref, rank, world_size)


class HeadByHeadAttention(nn.Module):
    """The rank's query heads (and the output projection's columns for them) picked one head at a
    time by index and concatenated; its key and value heads a contiguous block."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        heads = heads_of_rank(rank, world_size, HEADS)
        rows = [ref.q_proj.weight[h * HEAD_DIM : (h + 1) * HEAD_DIM] for h in heads]
        columns = [ref.o_proj.weight[:, h * HEAD_DIM : (h + 1) * HEAD_DIM] for h in heads]
        self.q = nn.Parameter(torch.cat(rows).clone())
        self.o = nn.Parameter(torch.cat(columns, dim=1).clone())
        self.k = nn.Parameter(ref.k_proj.weight.chunk(world_size)[rank].clone())
        self.v = nn.Parameter(ref.v_proj.weight.chunk(world_size)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM) for w in (self.q, self.k, self.v))
        return all_reduce_sum(F.linear(causal_attention(q, k, v), self.o))


def heads_listed_one_ahead(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return HeadByHeadAttention(ref, rank, world_size)


class RangeEmbedding(nn.Module):
    """VocabParallelEmbedding: rank's rows [start, end) of the table, ids outside masked to 0."""

    def __init__(self, ref: nn.Module, start: int, end: int) -> None:
        super().__init__()
        self.start, self.end = start, end
        self.weight = nn.Parameter(ref.embed_tokens.weight[start:end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return all_reduce_sum(out)


def vocab_floor(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    start, end = vocab_range(ODD_VOCAB, rank, world_size)
    return RangeEmbedding(ref, start, end)


def vocab_end_off_by_one(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    start, end = vocab_range_from_per_partition(VOCAB // world_size, rank)
    return RangeEmbedding(ref, start, end)


class MaskHelperEmbedding(nn.Module):
    """The shard's ids picked by `in_vocab_shard`, shifted to local rows, the rest zeroed."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.block = VOCAB // world_size
        self.start = rank * self.block
        self.weight = nn.Parameter(ref.embed_tokens.weight[self.start : self.start + self.block].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = in_vocab_shard(ids, self.start, self.block)
        local = (ids - self.start) * mask
        out = F.embedding(local, self.weight) * mask.unsqueeze(-1)
        return all_reduce_sum(out)


def vocab_bound_local(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MaskHelperEmbedding(ref, rank, world_size)


class BlockMLP(nn.Module):
    """Column-parallel up / row-parallel down over the hidden units [start, end)."""

    def __init__(self, ref: nn.Module, start: int, end: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight[start:end].clone())
        self.up_b = nn.Parameter(ref.up.bias[start:end].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, start:end].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        return all_reduce_sum(out) + self.down_b


def shard_start_next_block(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    rows = FFN // world_size
    start = shard_start(rank, rows)
    return BlockMLP(ref, start, start + rows)


def ceil_columns_floor(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    block = column_block(ODD_FFN, world_size)
    return BlockMLP(ref, rank * block, min((rank + 1) * block, ODD_FFN))


class ExpertParallelMoE(nn.Module):
    """Whole experts per rank (DeepSpeed-MoE without all-to-all): every rank routes all tokens,
    runs its own experts, and the ranks' sums are all-reduced."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        per_rank = local_expert_count(EXPERTS, world_size)
        self.first = expert_offset(EXPERTS, rank, world_size)
        self.route = ref.route
        self.router = ref.router
        self.experts = nn.ModuleList(ref.experts[self.first : self.first + per_rank])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for offset, expert in enumerate(self.experts):
            gate = (weights * (chosen == self.first + offset)).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        return all_reduce_sum(out)


def local_experts_global(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ExpertParallelMoE(ref, rank, world_size)
