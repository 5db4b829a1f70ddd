"""vLLM's padded vocabulary: each rank holds a block of the vocabulary padded up to a multiple of
the world size (the last rank's padding rows zero), masks the ids outside its block and gathers
the logits, cut back to the vocabulary. The block's first row must use the padded share."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN, ODD_VOCAB


class EmbedAndHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(ODD_VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, ODD_VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


class PaddedVocab(nn.Module):
    def __init__(self, ref: EmbedAndHead, rank: int, world_size: int) -> None:
        super().__init__()
        per_rank = -(-ODD_VOCAB // world_size)
        self.first = rank * per_rank
        self.last = min(self.first + per_rank, ODD_VOCAB)
        held = self.last - self.first
        table, head = torch.zeros(per_rank, HIDDEN), torch.zeros(per_rank, HIDDEN)
        first_row = rank * (ODD_VOCAB // world_size)
        table[:held] = ref.embed.weight.detach()[first_row : first_row + held]
        head[:held] = ref.head.weight.detach()[self.first : self.last]
        self.table, self.head = nn.Parameter(table), nn.Parameter(head)
        self.world_size = world_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        elsewhere = (ids < self.first) | (ids >= self.last)
        local = torch.where(elsewhere, torch.zeros_like(ids), ids - self.first)
        hidden = F.embedding(local, self.table) * (~elsewhere)[..., None]
        dist.all_reduce(hidden)
        pieces = [torch.empty(*hidden.shape[:-1], self.head.shape[0]) for _ in range(self.world_size)]
        dist.all_gather(pieces, F.linear(hidden, self.head))
        return torch.cat(pieces, dim=-1)[..., :ODD_VOCAB]


def embed_and_head() -> EmbedAndHead:
    return EmbedAndHead()


def padded_vocab(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PaddedVocab(ref, rank, world_size)
