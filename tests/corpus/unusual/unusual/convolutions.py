"""Convolutions split over ranks, and a multi-query attention whose one key / value head is read
from a fused projection by `unbind`: our own small programs."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN

CHANNELS, FILTERS, PATCH = 3, 8, 4


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def _gather_last(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


class PatchEmbedding(nn.Module):
    """A ViT patch embedding: a strided convolution, the patches flattened to tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(CHANNELS, HIDDEN, kernel_size=PATCH, stride=PATCH)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)


class ColumnParallelPatchEmbedding(nn.Module):
    """The rank's block of the filters and the bias; the tokens' features gathered."""

    def __init__(self, ref: PatchEmbedding, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.proj.weight.chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(ref.proj.bias.chunk(world_size, dim=0)[rank].clone())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches = F.conv2d(images, self.weight, self.bias, stride=PATCH)
        return _gather_last(patches.flatten(2).transpose(1, 2))


class ConvBlock(nn.Module):
    """Two 3x3 convolutions with a ReLU between."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(CHANNELS, FILTERS, 3, padding=1)
        self.project = nn.Conv2d(FILTERS, CHANNELS, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.project(F.relu(self.expand(images)))


class ChannelParallelConvBlock(nn.Module):
    """The first convolution split by its filters, the second by its input channels (its partial
    sums all-reduced, its bias added after, viewed (1, C, 1, 1))."""

    def __init__(self, ref: ConvBlock, rank: int, world_size: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(ref.expand.weight.chunk(world_size, dim=0)[rank].clone())
        self.b1 = nn.Parameter(ref.expand.bias.chunk(world_size, dim=0)[rank].clone())
        self.w2 = nn.Parameter(ref.project.weight.chunk(world_size, dim=1)[rank].clone())
        self.b2 = nn.Parameter(ref.project.bias.clone())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(F.conv2d(images, self.w1, self.b1, padding=1))
        return _all_reduce(F.conv2d(hidden, self.w2, padding=1)) + self.b2.view(1, -1, 1, 1)


class FusedMultiQueryAttention(nn.Module):
    """Falcon-style multi-query attention: one projection of [query heads; key; value]."""

    def __init__(self) -> None:
        super().__init__()
        self.query_key_value = nn.Linear(HIDDEN, HIDDEN + 2 * HEAD_DIM, bias=False)
        self.dense = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        fused = self.query_key_value(x)
        q = fused[..., :HIDDEN].view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = fused[..., HIDDEN : HIDDEN + HEAD_DIM].view(b, s, 1, HEAD_DIM).transpose(1, 2)
        v = fused[..., HIDDEN + HEAD_DIM :].view(b, s, 1, HEAD_DIM).transpose(1, 2)
        k, v = k.expand(-1, HEADS, -1, -1), v.expand(-1, HEADS, -1, -1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(out.transpose(1, 2).reshape(b, s, HIDDEN))


class HeadParallelMultiQueryAttention(nn.Module):
    """The rank's query heads, the key and value replicated: read as a [2, 1, head_dim] view of
    their projection and unbound."""

    def __init__(self, ref: FusedMultiQueryAttention, rank: int, world_size: int) -> None:
        super().__init__()
        width = HIDDEN // world_size
        fused = ref.query_key_value.weight
        self.query = nn.Parameter(fused[rank * width : (rank + 1) * width].clone())
        self.key_value = nn.Parameter(fused[HIDDEN:].clone())
        self.dense = nn.Parameter(ref.dense.weight[:, rank * width : (rank + 1) * width].clone())
        self.heads = HEADS // world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = F.linear(x, self.query).view(b, s, self.heads, HEAD_DIM).transpose(1, 2)
        k, v = F.linear(x, self.key_value).view(b, s, 2, 1, HEAD_DIM).unbind(2)
        k = k.transpose(1, 2).expand(-1, self.heads, -1, -1)
        v = v.transpose(1, 2).expand(-1, self.heads, -1, -1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _all_reduce(F.linear(out.transpose(1, 2).reshape(b, s, -1), self.dense))


def patch_embedding() -> PatchEmbedding:
    return PatchEmbedding()


def column_parallel_patch_embedding(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ColumnParallelPatchEmbedding(ref, rank, world_size)


def conv_block() -> ConvBlock:
    return ConvBlock()


def channel_parallel_conv_block(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ChannelParallelConvBlock(ref, rank, world_size)


def fused_multi_query_attention() -> FusedMultiQueryAttention:
    return FusedMultiQueryAttention()


def head_parallel_multi_query_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return HeadParallelMultiQueryAttention(ref, rank, world_size)


def images() -> tuple[torch.Tensor]:
    return (torch.randn(2, CHANNELS, 8, 8),)
