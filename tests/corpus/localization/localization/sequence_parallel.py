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


def _own_sequence_block(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's positions of a [batch, seq, hidden] value (a hand-written reduce-scatter's
    second half, after an all-reduce)."""
    per_rank = full.shape[1] // world_size
    return full.narrow(1, rank, per_rank)


class SequenceBlockMLP(nn.Module):
    """A tensor-parallel MLP whose row-parallel sums are all-reduced, each rank keeping its block
    of the positions (a reduce-scatter written by hand), the bias added to it, and the positions
    all-gathered back in rank order."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(partial)
        mine = _own_sequence_block(partial, self.rank, self.world_size) + self.down_b
        pieces = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(pieces, mine.contiguous())
        return torch.cat(pieces, dim=1)


def sequence_block_offset(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceBlockMLP(ref, rank, world_size)
