"""vLLM's driver-worker sampling: each rank's logits of its vocabulary block gathered to the driver
alone (`tensor_model_parallel_gather(logits, dst=0)`, `dist.gather` with a list on rank 0 and None
elsewhere), the driver's probabilities computed from the joined logits and broadcast to every
rank. Our own small equivalent; sizes and inputs as in models.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import VOCAB


class DriverSampler(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight).contiguous()
        pieces = [torch.empty_like(logits) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(logits, pieces, dst=0)
        if pieces is not None:
            probs = F.softmax(torch.cat(pieces, dim=-1), dim=-1)
        else:
            probs = torch.empty(*logits.shape[:-1], VOCAB, dtype=logits.dtype)
        dist.broadcast(probs, src=0)
        return probs


def driver_sampler(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return DriverSampler(ref, rank, world_size)
