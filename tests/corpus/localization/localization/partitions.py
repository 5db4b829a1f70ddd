"""Row- and column-parallel loaders whose partition bounds come from a partition helper (the way
Megatron's `VocabUtility` or a checkpoint converter's `partition_bounds` sit apart from the layer
that uses them), family `helper`: the layer is right, the helper's number is not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum
from .models import FFN


def partition_bounds(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """[first, last) of the rank's partition of `total` columns."""
    per_partition = total // world_size
    first = per_partition * rank
    last = min(first + per_partition, total - 1)
    return first, last


def partition_first_row(rows: int, rank: int, world_size: int) -> int:
    """The first row of the rank's block of `rows`-row blocks."""
    return rows * world_size - rows


class PartitionedMLP(nn.Module):
    """Column-parallel up, row-parallel down over the hidden units [first, last)."""

    def __init__(self, ref: nn.Module, first: int, last: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight[first:last].clone())
        self.up_b = nn.Parameter(ref.up.bias[first:last].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, first:last].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(F.linear(x, self.up_w, self.up_b))
        return all_reduce_sum(F.linear(hidden, self.down_w)) + self.down_b


def partition_end_short(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    first, last = partition_bounds(FFN, rank, world_size)
    return PartitionedMLP(ref, first, last)


class NarrowedMLP(nn.Module):
    """The same layer loaded with `narrow` from a first row and a row count."""

    def __init__(self, ref: nn.Module, first: int, rows: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight.narrow(0, first, rows).clone())
        self.up_b = nn.Parameter(ref.up.bias.narrow(0, first, rows).clone())
        self.down_w = nn.Parameter(ref.down.weight.narrow(1, first, rows).clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(F.linear(x, self.up_w, self.up_b))
        return all_reduce_sum(F.linear(hidden, self.down_w)) + self.down_b


def first_row_without_rank(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    rows = FFN // world_size
    return NarrowedMLP(ref, partition_first_row(rows, rank, world_size), rows)
