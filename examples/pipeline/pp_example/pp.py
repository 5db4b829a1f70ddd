"""The decoder split into pipeline stages, one per rank: rank 0 embeds the tokens and runs the
first layers, every rank hands the residual stream (its hidden states added to its residual) to
the next one, which starts its first block from it, and the last rank finishes with the final
norm and the LM head. Only the last rank returns the model's output (outputs = "last-rank")."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .model import Decoder


class PipelineStage(nn.Module):
    def __init__(self, reference: Decoder, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        per_stage = len(reference.layers) // world_size
        start = rank * per_stage
        self.layers = nn.ModuleList(reference.layers[start : start + per_stage])
        self.embed = reference.embed if rank == 0 else None
        self.norm = reference.norm if rank == world_size - 1 else None
        self.head = reference.head if rank == world_size - 1 else None
        self.dim = reference.cfg.dim

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            hidden, residual = self.embed(tokens), None
        else:
            hidden = torch.empty(*tokens.shape, self.dim, device=tokens.device)
            dist.recv(hidden, src=self.rank - 1)
            residual = None  # the stream arrives whole: the first block starts from it
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        if self.head is None:
            dist.send(hidden + residual, dst=self.rank + 1)
            return hidden
        return self.head(self.norm(hidden + residual))


def parallelize(reference: Decoder, rank: int, world_size: int) -> PipelineStage:
    return PipelineStage(reference, rank, world_size)
