"""A top-1 router on sequence-parallel tokens (Megatron's MoE layer under sequence parallelism, in
the shape DeepSpeed's top-1 gate writes its choice): each rank routes only its block of the
sequence, takes each token's most probable expert with `argmax` and its probability with `amax`
(the reference writes both as `max(-1)`), runs the replicated experts on its tokens and gathers
the sequence back."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN

EXPERTS, EXPERT_FFN = 4, 8


class TopOneExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.up = nn.ModuleList(nn.Linear(HIDDEN, EXPERT_FFN) for _ in range(EXPERTS))
        self.down = nn.ModuleList(nn.Linear(EXPERT_FFN, HIDDEN) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, chosen = self.router(x).softmax(-1).max(-1)
        out = torch.zeros_like(x)
        for e in range(EXPERTS):
            picked = (chosen == e).to(x.dtype)[..., None] * gate[..., None]
            out = out + picked * self.down[e](F.gelu(self.up[e](x)))
        return out


class SequenceParallelTopOne(nn.Module):
    def __init__(self, ref: TopOneExperts, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.ref = ref

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        block = x.shape[1] // self.world_size
        mine = x[:, self.rank * block : (self.rank + 1) * block]
        probabilities = self.ref.router(mine).softmax(-1)
        chosen, gate = probabilities.argmax(-1), probabilities.amax(-1)
        out = torch.zeros_like(mine)
        for e in range(EXPERTS):
            picked = (chosen == e).to(mine.dtype)[..., None] * gate[..., None]
            out = out + picked * self.ref.down[e](F.gelu(self.ref.up[e](mine)))
        pieces = [torch.empty_like(out) for _ in range(self.world_size)]
        dist.all_gather(pieces, out.contiguous())
        return torch.cat(pieces, dim=1)


def top_one_experts() -> TopOneExperts:
    return TopOneExperts()


def sequence_parallel_top_one(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceParallelTopOne(ref, rank, world_size)
