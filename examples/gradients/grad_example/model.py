"""A small residual MLP language model whose parameter gradients are verified.

The output head is frozen (a tied or pretrained projection kept fixed while the rest trains):
no gradient of its own, but every other gradient flows through it.
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
    ffn_dim: int = 32
    n_layers: int = 2
    batch: int = 8  # two micro-batches per rank at 4 data-parallel ranks
    seq_len: int = 8


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(self.norm(x))))


class MLPModel(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.head.weight.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build() -> MLPModel:
    return MLPModel(Config())


def example_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    cfg = Config()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=generator)
    targets = torch.randn(cfg.batch, cfg.seq_len, cfg.vocab_size, generator=generator)
    return tokens, targets


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every item of the batch."""
    return (logits - targets).pow(2).mean()


class WithLoss(nn.Module):
    """The model and its loss: what a training step differentiates."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_of(self.model(tokens), targets)


def build_with_loss() -> WithLoss:
    return WithLoss(build())
