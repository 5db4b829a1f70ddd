"""Expert parallelism with the experts' gates indexed wrongly (family `constant`): each rank runs
its own block of whole experts on every token and the partial outputs are all-reduced, but the
gate of each local expert must be read at the expert's global index."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class ExpertParallelMoE(nn.Module):
    """The router replicated, experts [first, first + local) on this rank, their weighted outputs
    summed and all-reduced over the ranks."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        local = len(ref.experts) // world_size
        self.first = rank * local
        self.router = ref.router
        self.experts = nn.ModuleList(ref.experts[self.first : self.first + local])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.router(x).topk(2, dim=-1)
        weights = F.softmax(weights, dim=-1)
        out = torch.zeros_like(x)
        for offset, expert in enumerate(self.experts):
            gate = (weights * (chosen == offset)).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        dist.all_reduce(out)
        return out


def gate_local_index(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ExpertParallelMoE(ref, rank, world_size)
