"""Per-head fused query/key/value read the way Hugging Face's Bloom and GPT-NeoX ports and Falcon
read it: the fused output viewed [.., heads, 3, head_dim] (one more dim than the reference's
[.., heads, 3 * head_dim]) and the three taken by index or `unbind`, the heads column-parallel
over whole heads (the per-head [q; k; v] rows make a rank's heads a contiguous block)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, SEQ


class ThreeWayViewAttention(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int, unbind: bool) -> None:
        super().__init__()
        qkv = ref.query_key_value
        self.qkv_weight = nn.Parameter(qkv.weight.chunk(world_size, dim=0)[rank].clone())
        self.qkv_bias = nn.Parameter(qkv.bias.chunk(world_size, dim=0)[rank].clone())
        self.dense_weight = nn.Parameter(ref.dense.weight.chunk(world_size, dim=1)[rank].clone())
        self.dense_bias = nn.Parameter(ref.dense.bias.clone())
        self.heads = ref.query_key_value.out_features // (3 * HEAD_DIM) // world_size
        self.unbind = unbind
        self.register_buffer("causal", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        fused = F.linear(x, self.qkv_weight, self.qkv_bias).view(s, b, self.heads, 3, HEAD_DIM)
        if self.unbind:  # GPT-NeoX-style ports
            q, k, v = fused.unbind(dim=3)
        else:  # Bloom's _split_heads
            q, k, v = fused[..., 0, :], fused[..., 1, :], fused[..., 2, :]
        scores = torch.einsum("sbhd,tbhd->bhst", q, k) / HEAD_DIM**0.5
        probs = F.softmax(scores.masked_fill(self.causal, float("-inf")), dim=-1)
        context = torch.einsum("bhst,tbhd->sbhd", probs, v).flatten(2)
        out = F.linear(context, self.dense_weight)
        dist.all_reduce(out)
        return out + self.dense_bias


def indexed_thirds(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ThreeWayViewAttention(ref, rank, world_size, unbind=False)


def unbound_thirds(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ThreeWayViewAttention(ref, rank, world_size, unbind=True)
