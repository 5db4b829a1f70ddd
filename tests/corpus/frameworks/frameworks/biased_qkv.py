"""Qwen2's attention as vLLM shards it: separate q, k and v projections with biases in the
checkpoint (o_proj without), fused per rank by QKVParallelLinear into one weight and one bias
([q rows of the rank; its kv rows; the same for v]), the fused output split into q, k and v.
Our own small equivalent; sizes and inputs as in models.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN, KV_HEADS, GQAAttention, causal_attention


class BiasedGQAAttention(GQAAttention):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM)


class FusedBiasedQKV(nn.Module):
    def __init__(self, ref: BiasedGQAAttention, rank: int, world_size: int) -> None:
        super().__init__()
        replicas = max(1, world_size // KV_HEADS)
        self.q_size = HEADS // world_size * HEAD_DIM
        self.kv_size = max(1, KV_HEADS // world_size) * HEAD_DIM
        q_rows = slice(rank * self.q_size, (rank + 1) * self.q_size)
        kv_rows = slice(rank // replicas * self.kv_size, (rank // replicas + 1) * self.kv_size)
        projections = ((ref.q_proj, q_rows), (ref.k_proj, kv_rows), (ref.v_proj, kv_rows))
        self.qkv_weight = nn.Parameter(torch.cat([p.weight[rows] for p, rows in projections]).clone())
        self.qkv_bias = nn.Parameter(torch.cat([p.bias[rows] for p, rows in projections]).clone())
        self.o_proj = nn.Parameter(ref.o_proj.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = F.linear(causal_attention(*(t.view(b, s, -1, HEAD_DIM) for t in (q, k, v))), self.o_proj)
        dist.all_reduce(out)
        return out


def biased_gqa_attention() -> BiasedGQAAttention:
    return BiasedGQAAttention()


def fused_biased_qkv(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FusedBiasedQKV(ref, rank, world_size)
