"""Multi-head latent attention in the manner of DeepSeek-V2 (our own small equivalent): the
queries and the keys' and values' up projection split by heads, the shared compressed key/value
and its rotary part computed on every rank, the rotary key broadcast to the heads the rank holds,
the output projection's partial sums all-reduced."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN

LATENT_HEADS, NOPE_DIM, ROPE_DIM, VALUE_DIM, KV_RANK = 4, 4, 2, 4, 6


class LatentAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, LATENT_HEADS * (NOPE_DIM + ROPE_DIM), bias=False)
        self.kv_a_proj = nn.Linear(HIDDEN, KV_RANK + ROPE_DIM, bias=False)
        self.kv_norm = nn.RMSNorm(KV_RANK)
        self.kv_b_proj = nn.Linear(KV_RANK, LATENT_HEADS * (NOPE_DIM + VALUE_DIM), bias=False)
        self.o_proj = nn.Linear(LATENT_HEADS * VALUE_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, NOPE_DIM + ROPE_DIM)
        q_nope, q_rope = q.split([NOPE_DIM, ROPE_DIM], dim=-1)
        compressed, k_rope = self.kv_a_proj(x).split([KV_RANK, ROPE_DIM], dim=-1)
        kv = self.kv_b_proj(self.kv_norm(compressed)).view(b, s, -1, NOPE_DIM + VALUE_DIM)
        k_nope, v = kv.split([NOPE_DIM, VALUE_DIM], dim=-1)
        # one rotary key for every head (of this program: all of them, or a rank's)
        k_rope = k_rope.view(b, s, 1, ROPE_DIM).expand(b, s, q.shape[2], ROPE_DIM)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rope], dim=-1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class LatentAttentionHeads(LatentAttention):
    def __init__(self, ref: LatentAttention, rank: int, world_size: int) -> None:
        nn.Module.__init__(self)
        self.q_proj = _by_heads(ref.q_proj, 0, rank, world_size)
        self.kv_a_proj, self.kv_norm = ref.kv_a_proj, ref.kv_norm  # shared by every head
        self.kv_b_proj = _by_heads(ref.kv_b_proj, 0, rank, world_size)
        self.o_proj = _by_heads(ref.o_proj, 1, rank, world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


def _by_heads(linear: nn.Linear, dim: int, rank: int, world_size: int) -> nn.Linear:
    weight = linear.weight.chunk(world_size, dim=dim)[rank]
    sharded = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device)
    sharded.weight = nn.Parameter(weight.clone())
    return sharded


def latent_attention() -> LatentAttention:
    return LatentAttention()


def latent_attention_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return LatentAttentionHeads(ref, rank, world_size)
