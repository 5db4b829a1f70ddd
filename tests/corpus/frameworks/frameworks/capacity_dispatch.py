"""Switch-Transformer-style experts with a static capacity, dispatched and combined by einsum
(Mesh-TensorFlow / GShard's formulation, as fairseq's and DeepSpeed's top-1 gates write it): top-1
routing, each token's slot in its expert from a cumulative sum of the one-hot routing, tokens past
the capacity dropped, dispatch and combine tensors [tokens, experts, capacity]. Expert-parallel:
each rank keeps its experts' columns of both tensors (a replicated, computed value sliced per
rank), runs its experts and all-reduces the combined tokens."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN

EXPERTS, CAPACITY, EXPERT_FFN = 4, 5, 8


def _routing(router: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    probabilities = F.linear(tokens, router).softmax(-1)
    gate, chosen = probabilities.max(-1)
    routed = F.one_hot(chosen, EXPERTS).to(tokens.dtype)  # [tokens, experts]
    slot = (routed.cumsum(0) - 1) * routed  # the token's place in its expert's queue
    kept = (slot < CAPACITY).to(tokens.dtype) * routed
    slots = F.one_hot(slot.sum(-1).long().clamp(max=CAPACITY - 1), CAPACITY).to(tokens.dtype)
    dispatch = kept[:, :, None] * slots[:, None, :]  # [tokens, experts, capacity]
    return dispatch, dispatch * gate[:, None, None]


class CapacityExperts(nn.Module):
    def __init__(self, experts: int = EXPERTS) -> None:
        super().__init__()
        self.router = nn.Parameter(torch.randn(EXPERTS, HIDDEN) * 0.3)
        self.w_in = nn.Parameter(torch.randn(experts, HIDDEN, EXPERT_FFN) * 0.3)
        self.w_out = nn.Parameter(torch.randn(experts, EXPERT_FFN, HIDDEN) * 0.3)

    def experts(self, dispatch: torch.Tensor, combine: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        queued = torch.einsum("tec,th->ech", dispatch, tokens)
        processed = torch.bmm(F.gelu(torch.bmm(queued, self.w_in)), self.w_out)  # [experts, capacity, hidden]
        return torch.einsum("tec,ech->th", combine, processed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, HIDDEN)
        dispatch, combine = _routing(self.router, tokens)
        return self.experts(dispatch, combine, tokens).view(x.shape)


class ExpertParallelCapacity(CapacityExperts):
    def __init__(self, ref: CapacityExperts, rank: int, world_size: int) -> None:
        super().__init__(EXPERTS // world_size)
        self.own = slice(rank * EXPERTS // world_size, (rank + 1) * EXPERTS // world_size)
        with torch.no_grad():
            self.router.copy_(ref.router)
            self.w_in.copy_(ref.w_in[self.own])
            self.w_out.copy_(ref.w_out[self.own])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, HIDDEN)
        dispatch, combine = _routing(self.router, tokens)
        out = self.experts(dispatch[:, self.own], combine[:, self.own], tokens)
        dist.all_reduce(out)
        return out.view(x.shape)


def capacity_experts() -> CapacityExperts:
    return CapacityExperts()


def expert_parallel_capacity(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ExpertParallelCapacity(ref, rank, world_size)
