"""A nonlinear op applied to a rank's partial sum before the all-reduce (family `nonlinear`):
the row-parallel output is a partial sum until it is reduced; a norm, activation, softmax or
soft-cap of the partial sums is not the op of their sum. The bias is pre-divided by the world
size (each rank adds its share before the reduction), which is right."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum
from .models import SOFTCAP


class RowParallelHead(nn.Module):
    """Column-parallel up, row-parallel down (bias / world_size on each rank), then `self.finish`."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.up_w, self.up_b))
        return F.linear(h, self.down_w) + self.down_b / self.world_size


class NormedRowParallel(RowParallelHead):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.norm = ref.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.partial(x)
        return all_reduce_sum(self.norm(partial))


def rmsnorm_before_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return NormedRowParallel(ref, rank, world_size)


class LayerNormedRowParallel(RowParallelHead):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.ln = ref.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(self.ln(self.partial(x)))


def layernorm_before_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return LayerNormedRowParallel(ref, rank, world_size)


class ActivatedRowParallel(RowParallelHead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(F.gelu(self.partial(x)))


def gelu_before_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ActivatedRowParallel(ref, rank, world_size)


class ClassifierRowParallel(RowParallelHead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.partial(x)
        probs = all_reduce_sum(F.softmax(logits, dim=-1))
        return probs


def softmax_before_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ClassifierRowParallel(ref, rank, world_size)


class SoftcappedRowParallelHead(nn.Module):
    """Gemma-2's LM head split along the hidden dim (row-parallel; the input split by the layer
    itself), the final logit soft-cap."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x.chunk(self.world_size, dim=-1)[self.rank], self.weight)
        return all_reduce_sum(SOFTCAP * torch.tanh(local / SOFTCAP))


def softcap_before_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SoftcappedRowParallelHead(ref, rank, world_size)
