"""Hugging Face's grouped-query attention (`repeat_kv`: the key and value heads expanded to the
query heads, returned as they are when the count is 1) with its heads split over ranks: at 4
ranks each rank holds one query head and a replica of the key and value head it reads, so its
`repeat_kv` repeats nothing where the reference repeats every head twice. Our own small
equivalent; sizes and inputs as in models.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, KV_HEADS, GQAAttention


def repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, heads, seq, dim = hidden.shape
    if n_rep == 1:
        return hidden
    return hidden[:, :, None, :, :].expand(batch, heads, n_rep, seq, dim).reshape(batch, heads * n_rep, seq, dim)


class HFAttention(GQAAttention):
    def __init__(self) -> None:
        super().__init__()
        self.heads, self.kv_heads = HEADS, KV_HEADS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, HEAD_DIM).transpose(1, 2)
        n_rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * HEAD_DIM))


class ParallelHFAttention(HFAttention):
    """Query heads split; key and value heads split too, or each replicated on world_size /
    KV_HEADS consecutive ranks when there are fewer than ranks; o_proj row-parallel."""

    def __init__(self, ref: HFAttention, rank: int, world_size: int) -> None:
        super().__init__()
        replicas = max(1, world_size // KV_HEADS)
        self.heads, self.kv_heads = HEADS // world_size, max(1, KV_HEADS // world_size)
        kv_rows = self.kv_heads * HEAD_DIM
        kv = slice(rank // replicas * kv_rows, (rank // replicas + 1) * kv_rows)
        self.q_proj.weight = nn.Parameter(ref.q_proj.weight.chunk(world_size, dim=0)[rank].clone())
        self.k_proj.weight = nn.Parameter(ref.k_proj.weight[kv].clone())
        self.v_proj.weight = nn.Parameter(ref.v_proj.weight[kv].clone())
        self.o_proj.weight = nn.Parameter(ref.o_proj.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


def hf_attention() -> HFAttention:
    return HFAttention()


def parallel_hf_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelHFAttention(ref, rank, world_size)
