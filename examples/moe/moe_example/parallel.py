"""Parallel versions of the MoE model.

Expert parallelism (`parallelize_ep`): token groups are divided over the ranks and so are the
experts (as evenly as possible, the first ranks take one more). Each rank routes its own groups,
sends every expert's slots to the rank that holds the expert (all-to-all dispatch), runs its
experts on the slots of all groups, and sends the results back (all-to-all combine). The shared
expert runs on the rank's own groups; the outputs are gathered at the end.

Tensor-parallel experts (`parallelize_tp`, the layout of Llama 4's MoE): every rank routes all
tokens; each expert's hidden dim and the shared expert's are split over the ranks, so both give
partial sums, added and all-reduced once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .model import MLP, Config, MoE, MoEModel, route, run_experts


def experts_per_rank(n_experts: int, world_size: int) -> list[int]:
    """How many experts each rank holds: as even as possible, the first ranks take one more."""
    base, extra = divmod(n_experts, world_size)
    return [base + (1 if rank < extra else 0) for rank in range(world_size)]


def all_to_all(x: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
    """Send send[j] rows of x to rank j; receive receive[j] rows from rank j, in rank order."""
    out = x.new_empty((sum(receive), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive, input_split_sizes=send)
    return out


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    world_size = dist.get_world_size()
    gathered = x.new_empty((world_size * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(gathered, x.contiguous())
    return torch.cat(gathered.chunk(world_size), dim=dim)


class ExpertParallelMoE(nn.Module):
    def __init__(self, cfg: Config, rank: int, world_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.world_size = world_size
        self.per_rank = experts_per_rank(cfg.n_experts, world_size)
        self.first_expert = sum(self.per_rank[:rank])
        self.n_local = self.per_rank[rank]
        self.groups_per_rank = cfg.n_groups // world_size
        self.group_start = rank * self.groups_per_rank
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.w_in = nn.Parameter(torch.empty(self.n_local, cfg.dim, cfg.expert_dim))
        self.w_out = nn.Parameter(torch.empty(self.n_local, cfg.expert_dim, cfg.dim))
        self.shared = MLP(cfg.dim, cfg.shared_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, ranks, mine = self.cfg, self.world_size, self.groups_per_rank
        tokens = x.reshape(cfg.n_groups, -1, cfg.dim)[self.group_start : self.group_start + mine]
        weights, slots = route(self.router(tokens).softmax(dim=-1), cfg.top_k, cfg.capacity)
        priority_weights = weights.transpose(1, 2)  # choice-major, as the slots are
        combine = (priority_weights[..., None, None] * slots).sum(dim=1)
        expert_in = torch.einsum("gtec,gtm->egcm", slots.sum(dim=1), tokens)
        # Dispatch: every rank's slots for my experts, source rank first.
        received = all_to_all(expert_in, send=self.per_rank, receive=[self.n_local] * ranks)
        local_in = received.view(ranks, self.n_local, mine, cfg.capacity, cfg.dim).transpose(0, 1)
        local_out = run_experts(
            local_in.reshape(self.n_local, cfg.n_groups, cfg.capacity, cfg.dim), self.w_in, self.w_out
        )
        # Combine: each rank's groups back to it, expert blocks in rank order.
        by_rank = local_out.view(self.n_local, ranks, mine, cfg.capacity, cfg.dim).transpose(0, 1)
        sent = by_rank.reshape(ranks * self.n_local, mine, cfg.capacity, cfg.dim)
        expert_out = sent.new_empty((cfg.n_experts, mine, cfg.capacity, cfg.dim))
        # output split sizes, then input split sizes: the dispatch's, swapped
        dist.all_to_all_single(expert_out, sent, self.per_rank, [self.n_local] * ranks)
        routed = torch.einsum("gtec,egcm->gtm", combine, expert_out)
        return gather(routed + self.shared(tokens), dim=0).view_as(x)


class TensorParallelMLP(nn.Module):
    """Column-parallel up, row-parallel down: a partial sum of the MLP's output."""

    def __init__(self, dim: int, hidden: int, world_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden // world_size, bias=False)
        self.down = nn.Linear(hidden // world_size, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


class TensorParallelMoE(nn.Module):
    def __init__(self, cfg: Config, world_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        local_dim = cfg.expert_dim // world_size
        self.w_in = nn.Parameter(torch.empty(cfg.n_experts, cfg.dim, local_dim))
        self.w_out = nn.Parameter(torch.empty(cfg.n_experts, local_dim, cfg.dim))
        self.shared = TensorParallelMLP(cfg.dim, cfg.shared_dim, world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        tokens = x.reshape(cfg.n_groups, -1, cfg.dim)
        weights, slots = route(self.router(tokens).softmax(dim=-1), cfg.top_k, cfg.capacity)
        combine = (weights.transpose(1, 2)[..., None, None] * slots).sum(dim=1)
        expert_in = torch.einsum("gtec,gtm->egcm", slots.sum(dim=1), tokens)
        routed = torch.einsum("gtec,egcm->gtm", combine, run_experts(expert_in, self.w_in, self.w_out))
        shared = self.shared(tokens)
        # Both partial sums are added first and reduced once.
        return all_reduce(routed + shared).view_as(x)


def shard(weight: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous 1/world_size block of `weight` along `dim`."""
    return weight.chunk(world_size, dim=dim)[rank]


def _copy_replicated(model: MoEModel, reference: MoEModel) -> None:
    model.embed.weight.copy_(reference.embed.weight)
    model.norm.weight.copy_(reference.norm.weight)
    model.head.weight.copy_(reference.head.weight)
    for layer, ref_layer in zip(model.layers, reference.layers, strict=True):
        layer.norm.weight.copy_(ref_layer.norm.weight)
        layer.moe.router.weight.copy_(ref_layer.moe.router.weight)


@torch.no_grad()
def parallelize_ep(reference: MoEModel, rank: int, world_size: int) -> MoEModel:
    model = MoEModel(reference.cfg)
    for layer in model.layers:
        layer.moe = ExpertParallelMoE(reference.cfg, rank, world_size)
    _copy_replicated(model, reference)
    for layer, ref_layer in zip(model.layers, reference.layers, strict=True):
        moe, ref_moe = layer.moe, ref_layer.moe
        assert isinstance(moe, ExpertParallelMoE) and isinstance(ref_moe, MoE)
        experts = slice(moe.first_expert, moe.first_expert + moe.n_local)
        moe.w_in.copy_(ref_moe.w_in[experts])
        moe.w_out.copy_(ref_moe.w_out[experts])
        moe.shared.load_state_dict(ref_moe.shared.state_dict())
    return model


@torch.no_grad()
def parallelize_tp(reference: MoEModel, rank: int, world_size: int) -> MoEModel:
    model = MoEModel(reference.cfg)
    for layer in model.layers:
        layer.moe = TensorParallelMoE(reference.cfg, world_size)
    _copy_replicated(model, reference)
    for layer, ref_layer in zip(model.layers, reference.layers, strict=True):
        moe, ref_moe = layer.moe, ref_layer.moe
        assert isinstance(moe, TensorParallelMoE) and isinstance(ref_moe, MoE)
        moe.w_in.copy_(shard(ref_moe.w_in, 2, rank, world_size))
        moe.w_out.copy_(shard(ref_moe.w_out, 1, rank, world_size))
        moe.shared.up.weight.copy_(shard(ref_moe.shared.up.weight, 0, rank, world_size))
        moe.shared.down.weight.copy_(shard(ref_moe.shared.down.weight, 1, rank, world_size))
    return model
