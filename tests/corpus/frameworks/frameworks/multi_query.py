"""Falcon-7B's multi-query attention as vLLM shards it: one fused projection holding every query
head, then the single key head and the single value head; each rank keeps its query heads and the
whole key and value (replicated), and picks the key and value out of the fused output with a list
index (`fused[..., [-2], :]`), as the reference does. Sizes and inputs as in models.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN


def _attend(fused: torch.Tensor, query_heads: int) -> torch.Tensor:
    batch, seq = fused.shape[:2]
    query = fused[..., :-2, :].transpose(1, 2)
    key = fused[..., [-2], :].transpose(1, 2)
    value = fused[..., [-1], :].transpose(1, 2)
    out = F.scaled_dot_product_attention(query, key.expand_as(query), value.expand_as(query), is_causal=True)
    return out.transpose(1, 2).reshape(batch, seq, query_heads * HEAD_DIM)


class MultiQueryAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query_key_value = nn.Linear(HIDDEN, (HEADS + 2) * HEAD_DIM, bias=False)
        self.dense = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.query_key_value(x).view(*x.shape[:2], HEADS + 2, HEAD_DIM)
        return self.dense(_attend(fused, HEADS))


class ParallelMultiQueryAttention(nn.Module):
    def __init__(self, ref: MultiQueryAttention, rank: int, world_size: int) -> None:
        super().__init__()
        self.local_heads = HEADS // world_size
        weight = ref.query_key_value.weight
        queries = weight[: HEADS * HEAD_DIM].chunk(world_size, dim=0)[rank]
        self.query_key_value = nn.Parameter(torch.cat([queries, weight[HEADS * HEAD_DIM :]]).clone())
        self.dense = nn.Parameter(ref.dense.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = F.linear(x, self.query_key_value).view(*x.shape[:2], self.local_heads + 2, HEAD_DIM)
        out = F.linear(_attend(fused, self.local_heads), self.dense)
        dist.all_reduce(out)
        return out


def multi_query_attention() -> MultiQueryAttention:
    return MultiQueryAttention()


def parallel_multi_query_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelMultiQueryAttention(ref, rank, world_size)
