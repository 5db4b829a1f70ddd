"""A fused [q; k; v] projection split by a reshape (timm's ViT attention: the fused dim viewed as
[3, heads, head_dim], q, k and v unbound from the leading 3), sharded by a weight loader (family
`fused`, added case): each rank needs its heads of q, of k and of v, not one block of the rows."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN


class ViTAttention(nn.Module):
    def __init__(self, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(HIDDEN, 3 * heads * HEAD_DIM)
        self.proj = nn.Linear(heads * HEAD_DIM, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


def vit_attention() -> ViTAttention:
    return ViTAttention()


def load_qkv(param: torch.Tensor, loaded: torch.Tensor, rank: int, world_size: int) -> None:
    """The fused qkv's loader (its weight and its bias): the rank's rows copied into `param`."""
    rows = loaded.shape[0] // world_size
    with torch.no_grad():
        param.copy_(loaded[rank * rows : (rank + 1) * rows])


def load_columns(param: torch.Tensor, loaded: torch.Tensor, rank: int, world_size: int) -> None:
    """A row-parallel loader: the rank's columns of a checkpoint weight."""
    columns = loaded.shape[1] // world_size
    with torch.no_grad():
        param.copy_(loaded[:, rank * columns : (rank + 1) * columns])


class ParallelViTAttention(ViTAttention):
    """The rank's heads; proj's partial sums all-reduced before its bias."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(HEADS // world_size)
        self.proj.bias = None
        self.proj_bias = nn.Parameter(ref.proj.bias.detach().clone())
        load_qkv(self.qkv.weight, ref.qkv.weight, rank, world_size)
        load_qkv(self.qkv.bias, ref.qkv.bias, rank, world_size)
        load_columns(self.proj.weight, ref.proj.weight, rank, world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out + self.proj_bias


def vit_qkv_rows(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelViTAttention(ref, rank, world_size)
