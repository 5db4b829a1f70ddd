"""A decoder's attention writing keys and values into a preallocated cache at the tokens'
positions (gpt-fast's KVCache.update: `k_cache[:, :, input_pos] = k`), then attending over the
whole cache with a mask of the positions written. Each rank keeps its heads of the projections
and of the reference's cache (its block of the head dim), so the write is the reference's write
on that block. Our own small equivalent; sizes as in models.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import BATCH, HEAD_DIM, HEADS, HIDDEN, SEQ

MAX_SEQ = SEQ + 4


class CachedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wqkv = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.register_buffer("k_cache", torch.zeros(BATCH, HEADS, MAX_SEQ, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(BATCH, HEADS, MAX_SEQ, HEAD_DIM))

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        heads = self.k_cache.shape[1]
        batch, seq, _ = x.shape
        q, k, v = (t.view(batch, seq, heads, HEAD_DIM).transpose(1, 2) for t in self.wqkv(x).chunk(3, dim=-1))
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, heads * HEAD_DIM))


class ParallelCachedAttention(CachedAttention):
    def __init__(self, ref: CachedAttention, rank: int, world_size: int) -> None:
        super().__init__()
        q, k, v = ref.wqkv.weight.chunk(3, dim=0)
        self.wqkv.weight = nn.Parameter(torch.cat([t.chunk(world_size, dim=0)[rank] for t in (q, k, v)]).clone())
        self.wo.weight = nn.Parameter(ref.wo.weight.chunk(world_size, dim=1)[rank].clone())
        self.k_cache = ref.k_cache.chunk(world_size, dim=1)[rank].clone()
        self.v_cache = ref.v_cache.chunk(world_size, dim=1)[rank].clone()

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = super().forward(x, input_pos, mask)
        dist.all_reduce(out)
        return out


def cached_attention() -> CachedAttention:
    return CachedAttention()


def parallel_cached_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelCachedAttention(ref, rank, world_size)


def prefill() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first SEQ tokens at positions 0..SEQ-1, each seeing the cache up to its own position."""
    written = torch.ones(SEQ, MAX_SEQ, dtype=torch.bool).tril()
    mask = torch.zeros(SEQ, MAX_SEQ).masked_fill(~written, float("-inf"))
    return torch.randn(BATCH, SEQ, HIDDEN), torch.arange(SEQ), mask
