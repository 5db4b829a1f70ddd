"""Values reduced together in one buffer (a coalesced all-reduce) and unpacked after it
(family `collective`)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, causal_attention


class CoalescedParallelResidual(nn.Module):
    """A parallel-residual block with the heads and the hidden units split over ranks; the
    attention's and the MLP's partial outputs flattened into one buffer, all-reduced once, and
    unpacked."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        attn, mlp = ref.attn, ref.mlp
        self.q, self.k, self.v = (
            nn.Parameter(p.weight.chunk(world_size, dim=0)[rank].clone())
            for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        self.o = nn.Parameter(attn.o_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.up_w = nn.Parameter(mlp.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(mlp.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(mlp.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(mlp.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM) for w in (self.q, self.k, self.v))
        attn = F.linear(causal_attention(q, k, v), self.o)
        mlp = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        buffer = torch.cat([attn.flatten(), mlp.flatten()])
        dist.all_reduce(buffer)
        n = attn.numel()
        attn = buffer[:n].view_as(attn)
        mlp = buffer[n - 1 : 2 * n - 1].view_as(mlp) + self.down_b
        return x + attn + mlp


def coalesced_unpacked_off_by_one(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return CoalescedParallelResidual(ref, rank, world_size)
