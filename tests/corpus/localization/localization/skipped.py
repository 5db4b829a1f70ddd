"""An operation of the reference left out on every rank (family `skipped`): the residual MLP
block with Megatron's column- and row-parallel linears, the row-parallel one returning its bias
for the caller to add (`skip_bias_add`), where one line drops an add the reference makes."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class RowParallelDown(nn.Module):
    """Columns [rank * ffn / ws, ...) of the weight; the partial sums all-reduced; the bias
    returned apart, as Megatron's RowParallelLinear does with `skip_bias_add=True`."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.clone())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = F.linear(x, self.weight)
        dist.all_reduce(out)
        return out, self.bias


class Block(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.norm = ref.norm
        self.up_w = nn.Parameter(ref.mlp.up.weight.chunk(world_size)[rank].clone())
        self.up_b = nn.Parameter(ref.mlp.up.bias.chunk(world_size)[rank].clone())
        self.down = RowParallelDown(ref.mlp.down, rank, world_size)


class ResidualDropped(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.down(F.gelu(F.linear(self.norm(x), self.up_w, self.up_b)))
        return out + bias


class RowBiasDropped(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.down(F.gelu(F.linear(self.norm(x), self.up_w, self.up_b)))
        return out + x


class ColumnBiasDropped(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(self.norm(x), self.up_w)
        out, bias = self.down(F.gelu(hidden))
        return x + out + bias


def residual_dropped(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ResidualDropped(ref, rank, world_size)


def row_bias_dropped(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RowBiasDropped(ref, rank, world_size)


def column_bias_dropped(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ColumnBiasDropped(ref, rank, world_size)
