"""GPT-NeoX's fused projection laid out per head ([q_h; k_h; v_h] for each head h): a rank's block
of whole heads is a proper shard, which the reference views into heads before splitting each into
q, k and v (family `fused`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum
from .models import HEAD_DIM, HEADS, HIDDEN, causal_attention


class PerHeadQKVAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query_key_value = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM)
        self.dense = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        per_head = self.query_key_value(x).view(b, s, -1, 3 * HEAD_DIM)
        q, k, v = per_head.split(HEAD_DIM, dim=-1)
        return self.dense(causal_attention(q, k, v))


class SplitAsBlocked(nn.Module):
    """Each rank's block of whole heads (right for the per-head layout), split as if the weight were
    [q; k; v] blocked."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.qkv_w = nn.Parameter(ref.query_key_value.weight.chunk(world_size, dim=0)[rank].clone())
        self.qkv_b = nn.Parameter(ref.query_key_value.bias.chunk(world_size, dim=0)[rank].clone())
        self.dense = nn.Parameter(ref.dense.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        fused = F.linear(x, self.qkv_w, self.qkv_b)
        q, k, v = (t.reshape(b, s, -1, HEAD_DIM) for t in fused.chunk(3, dim=-1))
        return all_reduce_sum(F.linear(causal_attention(q, k, v), self.dense))


def per_head_qkv_attention() -> PerHeadQKVAttention:
    return PerHeadQKVAttention()


def per_head_split_as_blocked(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SplitAsBlocked(ref, rank, world_size)
