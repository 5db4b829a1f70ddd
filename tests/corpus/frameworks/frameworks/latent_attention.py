"""DeepSeek-V2's multi-head latent attention, written the way the Hugging Face model is (the
query through a low-rank projection and its norm, keys and values from one compressed latent and a
rotary key part shared by every head), at the corpus's tiny sizes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN, SEQ

MLA_HEADS, NOPE_DIM, ROPE_DIM, V_DIM, KV_RANK, Q_RANK = 4, 4, 2, 4, 6, 8


def _rotary_tables() -> tuple[torch.Tensor, torch.Tensor]:
    inverse = 1.0 / (10000 ** (torch.arange(0, ROPE_DIM, 2).float() / ROPE_DIM))
    angles = torch.outer(torch.arange(SEQ).float(), inverse)
    both = torch.cat([angles, angles], dim=-1)
    return both.cos(), both.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of [batch, heads, seq, ROPE_DIM] values (halves rotated)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class LatentRMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class LatentAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_a_proj = nn.Linear(HIDDEN, Q_RANK, bias=False)
        self.q_a_layernorm = LatentRMSNorm(Q_RANK)
        self.q_b_proj = nn.Linear(Q_RANK, MLA_HEADS * (NOPE_DIM + ROPE_DIM), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(HIDDEN, KV_RANK + ROPE_DIM, bias=False)
        self.kv_a_layernorm = LatentRMSNorm(KV_RANK)
        self.kv_b_proj = nn.Linear(KV_RANK, MLA_HEADS * (NOPE_DIM + V_DIM), bias=False)
        self.o_proj = nn.Linear(MLA_HEADS * V_DIM, HIDDEN, bias=False)
        cos, sin = _rotary_tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def attend(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """Attention of `heads` heads (all of them, or a rank's): [batch, seq, heads * V_DIM]."""
        b, s, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_rope = q.view(b, s, heads, NOPE_DIM + ROPE_DIM).transpose(1, 2).split([NOPE_DIM, ROPE_DIM], -1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([KV_RANK, ROPE_DIM], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, s, heads, NOPE_DIM + V_DIM).transpose(1, 2)
        k_nope, v = kv.split([NOPE_DIM, V_DIM], dim=-1)
        k_rope = rotate(k_rope.view(b, s, 1, ROPE_DIM).transpose(1, 2), self.cos, self.sin)
        query = torch.cat([q_nope, rotate(q_rope, self.cos, self.sin)], dim=-1)
        key = torch.cat([k_nope, k_rope.expand(-1, heads, -1, -1)], dim=-1)
        scale = 1 / math.sqrt(NOPE_DIM + ROPE_DIM)
        out = F.scaled_dot_product_attention(query, key, v, is_causal=True, scale=scale)
        return out.transpose(1, 2).reshape(b, s, heads * V_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(x, MLA_HEADS))


def latent_attention() -> LatentAttention:
    return LatentAttention()
