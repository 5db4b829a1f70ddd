"""Sequence-parallel reductions with the wrong operation (family `collective`, added cases): the
row-parallel partial sums are reduce-scattered over the tokens, each rank keeping its block."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, causal_attention


class TokenScatteredAttention(nn.Module):
    """GPT-2 attention, heads split over ranks (c_attn per part); c_proj's partial sums flattened
    to tokens and reduce-scattered over them, the bias added to each rank's tokens, the tokens
    all-gathered back."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size
        parts = ref.c_attn.weight.chunk(3), ref.c_attn.bias.chunk(3)
        self.qkv_w = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in parts[0]]).clone())
        self.qkv_b = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in parts[1]]).clone())
        self.proj_w = nn.Parameter(ref.c_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.proj_b = nn.Parameter(ref.c_proj.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in F.linear(x, self.qkv_w, self.qkv_b).chunk(3, dim=-1))
        partial = F.linear(causal_attention(q, k, v), self.proj_w).flatten(0, 1)
        local = torch.empty((partial.shape[0] // self.world_size, partial.shape[1]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(local, partial, op=dist.ReduceOp.AVG)
        tokens = torch.empty_like(partial)
        dist.all_gather_into_tensor(tokens, (local + self.proj_b).contiguous())
        return tokens.view(b, s, -1)


def token_reduce_scatter_avg(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return TokenScatteredAttention(ref, rank, world_size)
