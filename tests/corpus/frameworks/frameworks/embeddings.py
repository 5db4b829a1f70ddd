"""Vocabulary and head patterns: BLOOM's head-parallel attention with ALiBi (the slopes of all
heads computed in the forward and each rank slicing its heads'), tied word embeddings sharded by
vocabulary (one table for the lookup and the LM head, logits gathered), vLLM's vocabulary padded up
to a multiple of the world size (the last rank's padding rows zero, logits cut back to the
vocabulary), a row-parallel bias added on rank 0 alone before the all-reduce, and the
autograd-aware `torch.distributed.nn.functional.all_reduce`. Our own small equivalents."""

from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, ODD_VOCAB, VOCAB, alibi_slopes


def _gathered_vocabulary(logits: torch.Tensor, world_size: int) -> torch.Tensor:
    pieces = [torch.empty_like(logits) for _ in range(world_size)]
    dist.all_gather(pieces, logits)
    return torch.cat(pieces, dim=-1)


class AlibiHeadParallel(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.local_heads = HEADS // world_size
        self.first_head = rank * self.local_heads
        width = self.local_heads * HEAD_DIM
        block = slice(rank * width, (rank + 1) * width)
        self.wq = nn.Parameter(ref.q_proj.weight.detach()[block].clone())
        self.wk = nn.Parameter(ref.k_proj.weight.detach()[block].clone())
        self.wv = nn.Parameter(ref.v_proj.weight.detach()[block].clone())
        self.wo = nn.Parameter(ref.o_proj.weight.detach()[:, block].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(w: torch.Tensor) -> torch.Tensor:
            return F.linear(x, w).view(b, s, self.local_heads, HEAD_DIM).transpose(1, 2)

        q, k, v = heads(self.wq), heads(self.wk), heads(self.wv)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        slopes = alibi_slopes(HEADS)[self.first_head : self.first_head + self.local_heads]
        back = torch.arange(s)[None, :] - torch.arange(s)[:, None]
        scores = scores + slopes[:, None, None] * back
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        out = F.linear((probs @ v).transpose(1, 2).reshape(b, s, -1), self.wo)
        dist.all_reduce(out)
        return out


class TiedVocabParallel(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        rows = VOCAB // world_size
        self.first, self.last = rank * rows, (rank + 1) * rows
        self.table = nn.Parameter(ref.embed_tokens.weight.detach()[self.first : self.last].clone())
        self.norm = ref.norm
        self.world_size = world_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        elsewhere = (ids < self.first) | (ids >= self.last)
        found = F.embedding((ids - self.first).masked_fill(elsewhere, 0), self.table)
        hidden = found.masked_fill(elsewhere[..., None], 0.0)
        dist.all_reduce(hidden)
        return _gathered_vocabulary(F.linear(self.norm(hidden), self.table), self.world_size)


class PaddedVocabParallel(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        per_rank = -(-ODD_VOCAB // world_size)  # the vocabulary padded up to a multiple of the world
        self.first = rank * per_rank
        self.last = min(self.first + per_rank, ODD_VOCAB)
        held = self.last - self.first
        table = torch.zeros(per_rank, ref.embed_tokens.weight.shape[1])
        head = torch.zeros_like(table)
        table[:held] = ref.embed_tokens.weight.detach()[self.first : self.last]
        head[:held] = ref.lm_head.weight.detach()[self.first : self.last]
        self.table, self.head = nn.Parameter(table), nn.Parameter(head)
        self.world_size = world_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        elsewhere = (ids < self.first) | (ids >= self.last)
        local = torch.where(elsewhere, torch.zeros_like(ids), ids - self.first)
        hidden = F.embedding(local, self.table) * (~elsewhere)[..., None]
        dist.all_reduce(hidden)
        logits = _gathered_vocabulary(F.linear(hidden, self.head), self.world_size)
        return logits[..., :ODD_VOCAB]


class RankZeroBiasMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(ref.up.in_features, ref.up.out_features // world_size)
        self.down_weight = nn.Parameter(ref.down.weight.detach().chunk(world_size, dim=1)[rank].clone())
        self.down_bias = nn.Parameter(ref.down.bias.detach().clone())
        with torch.no_grad():
            self.up.weight.copy_(ref.up.weight.chunk(world_size, dim=0)[rank])
            self.up.bias.copy_(ref.up.bias.chunk(world_size, dim=0)[rank])
        self.adds_bias = rank == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(self.up(x)), self.down_weight)
        if self.adds_bias:
            out = out + self.down_bias
        dist.all_reduce(out)
        return out


class FunctionalAllReduceMLP(nn.Module):
    """Row-parallel with the bias divided among the ranks, summed by the autograd-aware all-reduce."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(ref.up.in_features, ref.up.out_features // world_size)
        self.down = nn.Linear(ref.up.out_features // world_size, ref.down.out_features)
        with torch.no_grad():
            self.up.weight.copy_(ref.up.weight.chunk(world_size, dim=0)[rank])
            self.up.bias.copy_(ref.up.bias.chunk(world_size, dim=0)[rank])
            self.down.weight.copy_(ref.down.weight.chunk(world_size, dim=1)[rank])
            self.down.bias.copy_(ref.down.bias / world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.nn import functional as differentiable

        with warnings.catch_warnings():  # deprecated in favour of functional collectives, still used
            warnings.simplefilter("ignore", FutureWarning)
            return differentiable.all_reduce(self.down(F.gelu(self.up(x))))


def alibi_head_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return AlibiHeadParallel(ref, rank, world_size)


def tied_vocab_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return TiedVocabParallel(ref, rank, world_size)


def padded_vocab_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PaddedVocabParallel(ref, rank, world_size)


def rank_zero_bias_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RankZeroBiasMLP(ref, rank, world_size)


def functional_all_reduce_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FunctionalAllReduceMLP(ref, rank, world_size)


class ShiftedIdsVocabEmbedding(nn.Module):
    """A vocabulary-parallel embedding that shifts the ids to its rows first and tests the local
    ids against its row count (`(local >= 0) & (local < rows)`), looks up the clamped local ids
    and zeroes the others by a product with the mask (Gemma-style stems written for TP)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rows = VOCAB // world_size
        self.start = rank * self.rows
        self.table = nn.Parameter(ref.embed_tokens.weight.detach()[self.start : self.start + self.rows].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.rows)
        out = F.embedding(local.clamp(0, self.rows - 1), self.table) * mine.unsqueeze(-1).to(self.table.dtype)
        dist.all_reduce(out)
        return out


def shifted_ids_vocab_embedding(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShiftedIdsVocabEmbedding(ref, rank, world_size)
