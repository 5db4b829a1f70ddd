"""Reductions overlapped with compute by splitting the input into chunks: each chunk's partial
sums are all-reduced on their own while the next chunk computes (DeepSpeed Domino splits the
batch in two halves; chunked sequence processing does the same along the sequence). Our own small
equivalents: the chunks' results concatenated, or written into one preallocated output by slices."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class BatchHalvesMLP(nn.Module):
    """A row-parallel MLP run on the two halves of the batch, each half's partial sums all-reduced
    before the next half is computed; the halves concatenated back along the batch."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_weight = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_bias = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_weight = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_bias = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        halves = []
        for half in x.chunk(2, dim=0):
            partial = F.linear(F.gelu(F.linear(half, self.up_weight, self.up_bias)), self.down_weight)
            dist.all_reduce(partial)
            halves.append(partial + self.down_bias)
        return torch.cat(halves, dim=0)


def batch_halves(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BatchHalvesMLP(ref, rank, world_size)


class SequenceChunkedMLP(nn.Module):
    """A row-parallel MLP run a block of the sequence at a time; each block's reduced result (its
    bias added) written into a preallocated output by a slice assignment."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, chunk: int = 2) -> None:
        super().__init__()
        self.up_weight = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_bias = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_weight = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_bias = nn.Parameter(ref.down.bias.clone())
        self.chunk = chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*x.shape[:-1], self.down_bias.shape[0], dtype=x.dtype, device=x.device)
        for start in range(0, x.shape[1], self.chunk):
            block = x[:, start : start + self.chunk]
            partial = F.linear(F.gelu(F.linear(block, self.up_weight, self.up_bias)), self.down_weight)
            dist.all_reduce(partial)
            out[:, start : start + self.chunk] = partial + self.down_bias
        return out


def sequence_chunks(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceChunkedMLP(ref, rank, world_size)
