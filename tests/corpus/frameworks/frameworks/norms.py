"""Normalisations over a width the ranks split: vLLM's q_norm for OLMo2 under tensor parallelism
(the mean of squares of each rank's block all-reduced and divided by the world size), the same
written with the sum of squares over the full width, and a LayerNorm over a column-parallel
output (mean and variance from all-reduced sums). Our own small equivalents."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class ShardedQNorm(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.q_proj = nn.Parameter(ref.q_proj.weight.detach().chunk(world_size, dim=0)[rank].clone())
        self.q_norm = nn.Parameter(ref.q_norm.weight.detach().chunk(world_size)[rank].clone())
        self.o_proj = nn.Parameter(ref.o_proj.weight.detach().chunk(world_size, dim=1)[rank].clone())
        self.world_size = world_size

    def normalised(self, q: torch.Tensor) -> torch.Tensor:
        mean_square = q.pow(2).mean(-1, keepdim=True)
        dist.all_reduce(mean_square)
        return q * torch.rsqrt(mean_square / self.world_size + 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.normalised(F.linear(x, self.q_proj)) * self.q_norm
        out = F.linear(q, self.o_proj)
        dist.all_reduce(out)
        return out


class ShardedQNormSumOfSquares(ShardedQNorm):
    def normalised(self, q: torch.Tensor) -> torch.Tensor:
        total = (q * q).sum(-1, keepdim=True)
        dist.all_reduce(total)
        return q * torch.rsqrt(total / (self.world_size * q.shape[-1]) + 1e-6)


class ShardedLayerNormMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()

        def block(t: torch.Tensor, dim: int = 0) -> nn.Parameter:
            return nn.Parameter(t.detach().chunk(world_size, dim=dim)[rank].clone())

        self.up_weight, self.up_bias = block(ref.up.weight), block(ref.up.bias)
        self.norm_weight, self.norm_bias = block(ref.ffn_norm.weight), block(ref.ffn_norm.bias)
        self.down_weight = block(ref.down.weight, dim=1)
        self.down_bias = nn.Parameter(ref.down.bias.detach().clone())
        self.width, self.eps = ref.ffn_norm.normalized_shape[0], ref.ffn_norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.up_weight, self.up_bias))
        total = h.sum(-1, keepdim=True)
        dist.all_reduce(total)
        centered = h - total / self.width
        spread = centered.pow(2).sum(-1, keepdim=True)
        dist.all_reduce(spread)
        normed = centered * torch.rsqrt(spread / self.width + self.eps) * self.norm_weight + self.norm_bias
        out = F.linear(normed, self.down_weight)
        dist.all_reduce(out)
        return out + self.down_bias


def sharded_q_norm(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedQNorm(ref, rank, world_size)


def sharded_q_norm_sum_of_squares(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedQNormSumOfSquares(ref, rank, world_size)


def sharded_layer_norm_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedLayerNormMLP(ref, rank, world_size)
