"""A sequence-parallel MLP whose output blocks travel around a ring of point-to-point exchanges
(batch_isend_irecv to the next rank, from the previous one), as ring attention rotates its key and
value blocks: a full turn, so the block received at the last step is the rank's own again and is
never read. Our own small equivalent."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class RingGatheredMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.ref, self.rank, self.world_size = ref, rank, world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank, ranks = self.rank, self.world_size
        rows = x.shape[1] // ranks
        mine = self.ref.down(F.gelu(self.ref.up(x[:, rank * rows : (rank + 1) * rows])))
        blocks = {rank: mine}
        current = mine.contiguous()
        for step in range(ranks):
            received = torch.empty_like(current)
            exchange = [
                dist.P2POp(dist.isend, current, (rank + 1) % ranks),
                dist.P2POp(dist.irecv, received, (rank - 1) % ranks),
            ]
            for request in dist.batch_isend_irecv(exchange):
                request.wait()
            source = (rank - step - 1) % ranks
            if source != rank:
                blocks[source] = received
            current = received
        return torch.cat([blocks[source] for source in range(ranks)], dim=1)


def ring_gathered_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RingGatheredMLP(ref, rank, world_size)
