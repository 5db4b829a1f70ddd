"""A small mixture-of-experts language model: top-k routing with a fixed expert capacity.

Routing follows GShard: tokens are split into groups, and within a group every expert takes at
most `capacity` (token, choice) pairs, every first choice before any second choice; pairs beyond
the capacity are dropped. Dispatch and combine are dense one-hot tensors, so every size is fixed
by the configuration, not by the data. A shared expert sees every token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab_size: int = 32
    dim: int = 16
    expert_dim: int = 24
    shared_dim: int = 32
    n_experts: int = 6
    top_k: int = 2
    n_groups: int = 4
    capacity: int = 4  # (token, choice) pairs an expert takes per group
    n_layers: int = 2
    batch: int = 4
    seq_len: int = 8


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def route(probs: torch.Tensor, top_k: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights [groups, tokens, top_k] and slot masks [groups, top_k, tokens, experts,
    capacity] for router probabilities [groups, tokens, experts]: slots[g, c, t, e, s] is 1 where
    choice c of token t takes slot s of expert e."""
    n_groups, n_tokens, n_experts = probs.shape
    weights, chosen = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    # Choice-major order: every token's first choice is queued before any second choice.
    by_priority = F.one_hot(chosen, n_experts).transpose(1, 2).flatten(1, 2)
    slot = by_priority.cumsum(dim=1) - 1
    kept = by_priority * (slot < capacity)
    slots = F.one_hot(slot.clamp(0, capacity - 1), capacity) * kept.unsqueeze(-1)
    return weights, slots.view(n_groups, top_k, n_tokens, n_experts, capacity).to(probs.dtype)


def run_experts(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """Expert e's MLP on x[e]: x [experts, groups, capacity, dim], weights stacked by expert."""
    n_experts, n_groups, capacity, dim = x.shape
    hidden = F.silu(torch.bmm(x.reshape(n_experts, n_groups * capacity, dim), w_in))
    return torch.bmm(hidden, w_out).view(n_experts, n_groups, capacity, dim)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


class MoE(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        scale = cfg.dim**-0.5
        self.w_in = nn.Parameter(torch.randn(cfg.n_experts, cfg.dim, cfg.expert_dim) * scale)
        self.w_out = nn.Parameter(torch.randn(cfg.n_experts, cfg.expert_dim, cfg.dim) * cfg.expert_dim**-0.5)
        self.shared = MLP(cfg.dim, cfg.shared_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        tokens = x.reshape(cfg.n_groups, -1, cfg.dim)
        weights, slots = route(self.router(tokens).softmax(dim=-1), cfg.top_k, cfg.capacity)
        # every slot with the weight of the (choice, token) that takes it, both choice-major
        combine = (weights.transpose(1, 2)[..., None, None] * slots).sum(dim=1)
        expert_in = torch.einsum("gtec,gtm->egcm", slots.sum(dim=1), tokens)
        expert_out = run_experts(expert_in, self.w_in, self.w_out)
        routed = torch.einsum("gtec,egcm->gtm", combine, expert_out)
        return (routed + self.shared(tokens)).view_as(x)


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.dim)
        self.moe = MoE(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe(self.norm(x))


class MoEModel(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build() -> MoEModel:
    return MoEModel(Config())


def example_inputs() -> tuple[torch.Tensor]:
    cfg = Config()
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=generator),)
