"""DTensors made in the forward from local tensors (torchtitan, and code that moves between
plain tensors and DTensor at a layer's edge): partial sums wrapped with a `Partial()` placement and
redistributed to `Replicate()` (an all-reduce) or `Shard(1)` (a reduce-scatter along the
sequence), and a column-parallel output wrapped as `Shard(-1)` and gathered by `full_tensor()`.
Our own small equivalents."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard


class PartialSumsMLP(nn.Module):
    """A row-parallel MLP whose partial sums become a `Partial()` DTensor, redistributed to
    `placement`; the bias added to the local result."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, placement: object) -> None:
        super().__init__()
        self.up_weight = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_bias = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_weight = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_bias = nn.Parameter(ref.down.bias.clone())
        self.mesh = init_device_mesh("cpu", (world_size,))
        self.placement = placement

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(F.gelu(F.linear(x, self.up_weight, self.up_bias)), self.down_weight)
        wrapped = DTensor.from_local(partial, self.mesh, [Partial()])
        return wrapped.redistribute(self.mesh, [self.placement]).to_local() + self.down_bias


def partial_to_replicate(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PartialSumsMLP(ref, rank, world_size, Replicate())


def partial_to_sequence_shards(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PartialSumsMLP(ref, rank, world_size, Shard(1))


class FullTensorMLP(nn.Module):
    """A column-parallel up projection whose output is wrapped as `Shard(-1)` and gathered by
    `full_tensor()`; the down projection replicated."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_weight = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_bias = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down = ref.down
        self.mesh = init_device_mesh("cpu", (world_size,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.gelu(F.linear(x, self.up_weight, self.up_bias))
        return self.down(DTensor.from_local(local, self.mesh, [Shard(-1)]).full_tensor())


def full_tensor_gather(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FullTensorMLP(ref, rank, world_size)


class UnevenFullTensorHead(nn.Module):
    """A column-parallel LM head over a vocabulary torch.chunk splits unevenly (30 over 4 ranks:
    8, 8, 8, 6), wrapped with the global shape and stride so that `full_tensor()` gathers the
    uneven shards (DTensor pads the short one, gathers, and cuts the padding off)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())
        self.vocab = ref.lm_head.weight.shape[0]
        self.mesh = init_device_mesh("cpu", (world_size,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)
        shape = torch.Size((*local.shape[:-1], self.vocab))
        stride = (shape[1] * shape[2], shape[2], 1)
        return DTensor.from_local(local, self.mesh, [Shard(2)], shape=shape, stride=stride).full_tensor()


def uneven_full_tensor_head(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return UnevenFullTensorHead(ref, rank, world_size)
