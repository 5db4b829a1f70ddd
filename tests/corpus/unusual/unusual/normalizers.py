"""Gemma's embedding normalizer (our own small equivalent): the looked-up rows times
`torch.tensor(hidden ** 0.5)`, a 0-dim tensor made in the forward, here applied by each rank of a
vocabulary-parallel embedding to its masked rows before the all-reduce."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN, VOCAB


class NormalizedEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.embed_tokens(ids)
        return rows * torch.tensor(HIDDEN**0.5, dtype=rows.dtype)


class NormalizedVocabShard(nn.Module):
    def __init__(self, ref: NormalizedEmbedding, rank: int, world_size: int) -> None:
        super().__init__()
        per_rank = -(-VOCAB // world_size)
        self.start, self.end = rank * per_rank, min(VOCAB, (rank + 1) * per_rank)
        self.weight = nn.Parameter(ref.embed_tokens.weight[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        rows = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0) * torch.tensor(HIDDEN**0.5, dtype=rows.dtype)
        dist.all_reduce(rows)
        return rows


def normalized_embedding() -> NormalizedEmbedding:
    return NormalizedEmbedding()


def normalized_vocab_shard(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return NormalizedVocabShard(ref, rank, world_size)
