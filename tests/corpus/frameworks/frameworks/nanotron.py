"""nanotron's and picotron's tensor-parallel layers: the collectives wrapped in autograd Functions
(identity forward / all-reduce backward and its converse), as both libraries write them. Our own
small equivalents, nothing copied from their code."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import VOCAB


class DifferentiableIdentity(torch.autograd.Function):
    """nanotron: the identity forward, the gradient all-reduced backward (a column linear's input)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class DifferentiableAllReduceSum(torch.autograd.Function):
    """nanotron: the all-reduce forward, the identity backward (a row linear's output)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class TensorParallelColumnLinear(nn.Linear):
    def __init__(self, full: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__(full.in_features, full.out_features // world_size)
        with torch.no_grad():
            self.weight.copy_(full.weight.chunk(world_size, dim=0)[rank])
            self.bias.copy_(full.bias.chunk(world_size, dim=0)[rank])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(DifferentiableIdentity.apply(x), self.weight, self.bias)


class TensorParallelRowLinear(nn.Linear):
    """The bias whole, added to the all-reduced output."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__(full.in_features // world_size, full.out_features)
        with torch.no_grad():
            self.weight.copy_(full.weight.chunk(world_size, dim=1)[rank])
            self.bias.copy_(full.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return DifferentiableAllReduceSum.apply(F.linear(x, self.weight)) + self.bias


class NanotronMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = TensorParallelColumnLinear(ref.up, rank, world_size)
        self.down = TensorParallelRowLinear(ref.down, rank, world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def nanotron_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return NanotronMLP(ref, rank, world_size)


class CopyToModelParallelRegion(torch.autograd.Function):
    """picotron: the identity forward, the all-reduce backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(grad)
        return grad


class ReduceFromModelParallelRegion(torch.autograd.Function):
    """picotron: the all-reduce forward (skipped on one rank), the identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if dist.get_world_size() == 1:
            return x
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class PicotronColumnParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(full.bias.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(CopyToModelParallelRegion.apply(x), self.weight, self.bias)


class PicotronRowParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReduceFromModelParallelRegion.apply(F.linear(x, self.weight)) + self.bias


class PicotronVocabParallelEmbedding(nn.Module):
    """Ids outside the rank's block set to 0 by a boolean-mask assignment, the local lookup, their
    rows zeroed by another, then reduce_from_model_parallel_region."""

    def __init__(self, full: nn.Embedding, rank: int, world_size: int) -> None:
        super().__init__()
        block = VOCAB // world_size
        self.start, self.end = rank * block, (rank + 1) * block
        self.weight = nn.Parameter(full.weight[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        input_mask = (ids < self.start) | (ids >= self.end)
        masked = ids.clone() - self.start
        masked[input_mask] = 0
        out = F.embedding(masked, self.weight)
        out[input_mask, :] = 0.0
        return ReduceFromModelParallelRegion.apply(out)


class PicotronLM(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.embedding = PicotronVocabParallelEmbedding(ref.embedding, rank, world_size)
        self.up = PicotronColumnParallelLinear(ref.mlp.up, rank, world_size)
        self.down = PicotronRowParallelLinear(ref.mlp.down, rank, world_size)
        self.norm = ref.norm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(ids)
        return self.norm(h + self.down(F.gelu(self.up(h))))


def picotron_lm(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PicotronLM(ref, rank, world_size)
