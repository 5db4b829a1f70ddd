"""A row-parallel layer that keeps a bias of its own, set to zero, while the reference's bias is
added once after the all-reduce (a port that reuses the model's own layer class for the
row-parallel half, as Hugging Face GPT-2 style code with `Conv1D` or `nn.Linear` does)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import FFN, HIDDEN


class ZeroedBiasRowMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN // world_size)
        self.down = nn.Linear(FFN // world_size, HIDDEN)
        with torch.no_grad():
            self.up.weight.copy_(ref.up.weight.chunk(world_size, dim=0)[rank])
            self.up.bias.copy_(ref.up.bias.chunk(world_size, dim=0)[rank])
            self.down.weight.copy_(ref.down.weight.chunk(world_size, dim=1)[rank])
            self.down.bias.zero_()  # the full bias is added once, after the all-reduce
        self.bias = nn.Parameter(ref.down.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.down(F.gelu(self.up(x)))
        dist.all_reduce(partial)
        return partial + self.bias


class AddmmLinear(nn.Module):
    """A linear written the way GPT-2's Conv1D is: weight [in, out], `addmm` on flattened rows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return rows.view(*x.shape[:-1], self.weight.shape[-1])


class ZeroedBiasAddmmMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        up_w = ref.up.weight.t().chunk(world_size, dim=1)[rank].clone()
        self.up = AddmmLinear(up_w, ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        down_w = ref.down.weight.t().chunk(world_size, dim=0)[rank].clone()
        self.down = AddmmLinear(down_w, torch.zeros(HIDDEN))
        self.bias = nn.Parameter(ref.down.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.down(F.gelu(self.up(x)))
        dist.all_reduce(partial)
        return partial + self.bias


def zeroed_bias_row(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ZeroedBiasRowMLP(ref, rank, world_size)


def zeroed_bias_addmm(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ZeroedBiasAddmmMLP(ref, rank, world_size)
