"""A norm over groups of channels (Mamba2's gated RMSNorm, group norms) after a column-parallel
projection: with whole groups on each rank, every rank normalizes its groups exactly as the
reference does, so the group size stays the reference's; only the width is the rank's share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum
from .models import FFN, HIDDEN

GROUP = 8  # channels per group: 4 groups of the 32, whole groups on 2 or 4 ranks


class GroupRMSNorm(nn.Module):
    def __init__(self, group_size: int) -> None:
        super().__init__()
        self.group_size = group_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = x.view(*x.shape[:-1], -1, self.group_size)
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + 1e-6)
        return groups.view(x.shape)


class GroupNormedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.norm = GroupRMSNorm(GROUP)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.norm(F.silu(self.up(x))))


class GroupNormedColumns(nn.Module):
    """Each rank its block of up's rows (whole groups) and of down's columns."""

    def __init__(self, ref: GroupNormedMLP, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.norm = GroupRMSNorm(GROUP // world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(F.linear(self.norm(F.silu(F.linear(x, self.up_w))), self.down_w))


def group_normed_mlp() -> GroupNormedMLP:
    return GroupNormedMLP()


def group_size_divided(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return GroupNormedColumns(ref, rank, world_size)
