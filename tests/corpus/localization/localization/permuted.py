"""A Megatron sequence-parallel block computing in its own [s, b, h] layout inside a batch-first
model (family `permuted`): the activations are transposed on the way in and back on the way out,
so every rank value is a permutation of (a block of) a reference value, and each case's one wrong
line lies on that permuted layout."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _scatter_tokens(x: torch.Tensor) -> torch.Tensor:
    """The rank's block of the sequence (dim 0)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    return x.chunk(world_size, dim=0)[rank].contiguous()


def _gather_tokens(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty((dist.get_world_size() * x.shape[0], *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def _reduce_scatter_tokens(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


class SequenceFirstBlock(nn.Module):
    """x + mlp(norm(x)): the norm on the rank's tokens, gathered for the column-parallel up
    projection, the row-parallel down projection's partial sums reduce-scattered over the tokens,
    the bias and the residual on the rank's tokens, all of them gathered at the end."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.norm = ref.norm
        self.up_w = nn.Parameter(ref.mlp.up.weight.chunk(world_size)[rank].clone())
        self.up_b = nn.Parameter(ref.mlp.up.bias.chunk(world_size)[rank].clone())
        self.down_w = nn.Parameter(ref.mlp.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.mlp.down.bias.clone())

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(_gather_tokens(self.norm(x)), self.up_w, self.up_b))


class BiasBeforeReduceScatter(SequenceFirstBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _scatter_tokens(x.transpose(0, 1))
        out = _reduce_scatter_tokens(F.linear(self.hidden(x), self.down_w, self.down_b))
        return _gather_tokens(x + out).transpose(0, 1)


class SplitInsteadOfReduceScatter(SequenceFirstBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _scatter_tokens(x.transpose(0, 1))
        out = _scatter_tokens(F.linear(self.hidden(x), self.down_w))
        return _gather_tokens(x + out + self.down_b).transpose(0, 1)


class ReshapedBack(SequenceFirstBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _scatter_tokens(x.transpose(0, 1))
        out = _reduce_scatter_tokens(F.linear(self.hidden(x), self.down_w))
        y = _gather_tokens(x + out + self.down_b)
        return y.reshape(y.shape[1], y.shape[0], y.shape[2])


def bias_before_reduce_scatter(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BiasBeforeReduceScatter(ref, rank, world_size)


def split_instead_of_reduce_scatter(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SplitInsteadOfReduceScatter(ref, rank, world_size)


def reshaped_back(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ReshapedBack(ref, rank, world_size)
