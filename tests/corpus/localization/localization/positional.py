"""Positions and heads: Bloom-style ALiBi attention (a per-head slope on the key position, the
scores through `baddbmm`), whose slopes each rank must take for its own heads."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN


def alibi_slopes(heads: int) -> torch.Tensor:
    base = 2.0 ** (-(2.0 ** -(math.log2(heads) - 3)))
    return base ** torch.arange(1, heads + 1, dtype=torch.get_default_dtype())


class AlibiAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.dense = nn.Linear(HIDDEN, HIDDEN)
        self.heads = HEADS
        self.slopes = alibi_slopes(HEADS)

    def scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        fused = self.qkv(x).view(b, s, self.heads, 3, HEAD_DIM)
        q, k, v = (fused[..., i, :].transpose(1, 2).reshape(b * self.heads, s, HEAD_DIM) for i in range(3))
        bias = self.slopes[:, None] * torch.arange(s, dtype=x.dtype)[None, :]
        bias = bias[None, :, None, :].expand(b, -1, s, -1).reshape(b * self.heads, s, s)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(HEAD_DIM))
        return scores, v

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        scores, v = self.scores(x)
        probs = F.softmax(scores.view(b, self.heads, s, s), dim=-1).view(b * self.heads, s, s)
        return torch.bmm(probs, v).view(b, self.heads, s, HEAD_DIM).transpose(1, 2).reshape(b, s, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.attend(x))


class AlibiHeads(AlibiAttention):
    """Each rank its heads: the fused rows of its heads, its columns of the dense layer (bias after
    the sum) and, for the scores' bias, its heads' slopes."""

    def __init__(self, ref: AlibiAttention, rank: int, world_size: int) -> None:
        super().__init__()
        rows, columns = 3 * HIDDEN // world_size, HIDDEN // world_size
        self.qkv.weight = nn.Parameter(ref.qkv.weight[rank * rows : (rank + 1) * rows].clone())
        self.qkv.bias = nn.Parameter(ref.qkv.bias[rank * rows : (rank + 1) * rows].clone())
        self.dense.weight = nn.Parameter(ref.dense.weight[:, rank * columns : (rank + 1) * columns].clone())
        self.dense.bias = nn.Parameter(ref.dense.bias.clone())
        self.heads = HEADS // world_size
        self.slopes = alibi_slopes(HEADS)[: self.heads]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(self.attend(x), self.dense.weight)
        dist.all_reduce(partial)
        return partial + self.dense.bias


def alibi_attention() -> AlibiAttention:
    return AlibiAttention()


def alibi_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return AlibiHeads(ref, rank, world_size)
