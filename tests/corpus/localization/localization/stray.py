"""Rank values made wrong at a line before the first one that reads them: the reference's operation
on another operand (a vocabulary-parallel log-softmax whose sum of exponentials reads the logits
before the max is taken off), a value cut otherwise than the reference cuts it (GPT-OSS's
interleaved gate/up projection split in two halves), and a vocabulary-parallel embedding whose ids
are masked right and whose lookups are zeroed where they should be kept."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum, gather_last_dim
from .models import FFN, HIDDEN, VOCAB, Embedding


class LogSoftmaxHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.lm_head(x), dim=-1)


class VocabParallelLogSoftmax(nn.Module):
    """Megatron's way: the max and the sum of exponentials reduced over the vocabulary shards."""

    def __init__(self, ref: LogSoftmaxHead, rank: int, world_size: int) -> None:
        super().__init__()
        rows = VOCAB // world_size
        self.weight = nn.Parameter(ref.lm_head.weight.detach()[rank * rows : (rank + 1) * rows].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        top = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        shifted = logits - top
        total = all_reduce_sum(logits.exp().sum(dim=-1, keepdim=True))
        return gather_last_dim(shifted - total.log())


def log_softmax_head() -> LogSoftmaxHead:
    return LogSoftmaxHead()


def unshifted_sum_of_exponentials(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelLogSoftmax(ref, rank, world_size)


def clamped_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate = gate.clamp(max=7.0)
    return (up.clamp(-7.0, 7.0) + 1) * gate * torch.sigmoid(1.702 * gate)


class InterleavedGatedMLP(nn.Module):
    """GPT-OSS's MLP: one projection whose columns alternate gate, up, gate, up, ..."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * FFN)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        return self.down_proj(clamped_glu(gate_up[..., ::2], gate_up[..., 1::2]))


class ParallelInterleavedGatedMLP(nn.Module):
    """A block of whole (gate, up) pairs per rank: the pairs stay interleaved in the rank's block."""

    def __init__(self, ref: InterleavedGatedMLP, rank: int, world_size: int) -> None:
        super().__init__()
        cols = 2 * FFN // world_size
        block = slice(rank * cols, (rank + 1) * cols)
        self.gate_up = nn.Parameter(ref.gate_up_proj.weight.detach()[block].clone())
        self.gate_up_bias = nn.Parameter(ref.gate_up_proj.bias.detach()[block].clone())
        down = ref.down_proj.weight.detach()[:, rank * FFN // world_size : (rank + 1) * FFN // world_size]
        self.down = nn.Parameter(down.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(x, self.gate_up, self.gate_up_bias)
        gate, up = gate_up.chunk(2, dim=-1)
        return all_reduce_sum(F.linear(clamped_glu(gate, up), self.down))


def interleaved_gated_mlp() -> InterleavedGatedMLP:
    return InterleavedGatedMLP()


def interleaved_pairs_halved(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelInterleavedGatedMLP(ref, rank, world_size)


class InvertedOutputMaskEmbedding(nn.Module):
    """Megatron's vocabulary-parallel embedding: out-of-shard ids looked up at row 0, then zeroed."""

    def __init__(self, ref: Embedding, rank: int, world_size: int) -> None:
        super().__init__()
        rows = VOCAB // world_size
        self.start, self.end = rank * rows, (rank + 1) * rows
        self.weight = nn.Parameter(ref.embed_tokens.weight.detach()[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        looked_up = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        return all_reduce_sum(looked_up.masked_fill(~outside.unsqueeze(-1), 0.0))


def output_mask_inverted(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return InvertedOutputMaskEmbedding(ref, rank, world_size)
