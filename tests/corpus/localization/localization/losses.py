"""Vocabulary-parallel z-loss mistakes (PaLM's z-loss, the squared logsumexp of each token's
logits, on logits sharded over the vocabulary as Megatron computes its logsumexp)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

Z_LOSS = 1e-4


class LMHeadZLoss(nn.Module):
    """The reference: the LM head's logits and their z-loss."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Z_LOSS * torch.logsumexp(self.lm_head(x), dim=-1).pow(2)


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


class _VocabShard(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())


class MaxNotReduced(_VocabShard):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        logits_max = logits.amax(dim=-1)
        sum_exp = all_reduce_sum((logits - logits_max.unsqueeze(-1)).exp().sum(dim=-1))
        return Z_LOSS * (sum_exp.log() + logits_max).pow(2)


class LogBeforeSum(_VocabShard):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        logits_max = all_reduce_max(logits.amax(dim=-1))
        log_sum = all_reduce_sum((logits - logits_max.unsqueeze(-1)).exp().sum(dim=-1).log())
        return Z_LOSS * (log_sum + logits_max).pow(2)


def max_not_reduced(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MaxNotReduced(ref, rank, world_size)


def log_before_sum(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return LogBeforeSum(ref, rank, world_size)


class MaxNotAddedBack(_VocabShard):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        logits_max = all_reduce_max(logits.amax(dim=-1))
        sum_exp = all_reduce_sum((logits - logits_max.unsqueeze(-1)).exp().sum(dim=-1))
        return Z_LOSS * sum_exp.log().pow(2)


def max_not_added_back(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MaxNotAddedBack(ref, rank, world_size)


class LMHeadLoss(nn.Module):
    """The reference: the mean cross entropy of the LM head's logits over the labelled tokens
    (torch leaves out the labels equal to -100, its default ignore index)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


class MeanOverEveryToken(_VocabShard):
    """Megatron-style vocabulary-parallel cross entropy, averaged over every token."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        start = dist.get_rank() * logits.shape[-1]
        logits_max = all_reduce_max(logits.amax(dim=-1))
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (labels < start) | (labels >= start + logits.shape[-1])
        local = (labels - start).masked_fill(outside, 0)
        picked = all_reduce_sum(shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0))
        losses = all_reduce_sum(shifted.exp().sum(dim=-1)).log() - picked
        return losses.mean()


def mean_over_every_token(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MeanOverEveryToken(ref, rank, world_size)


class FlatTokensCountEveryToken(_VocabShard):
    """The same loss on tokens flattened first (ColossalAI's form), the ignored tokens' losses
    zeroed, but their sum divided by every token's count."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        partition = self.weight.shape[0]
        logits, labels = F.linear(x, self.weight).reshape(-1, partition), labels.reshape(-1)
        start = dist.get_rank() * partition
        shifted = logits - all_reduce_max(logits.amax(dim=-1)).unsqueeze(-1)
        outside = (labels < start) | (labels >= start + partition)
        local = (labels - start).masked_fill(outside, 0)
        picked = all_reduce_sum(shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0))
        ignored = labels == -100
        losses = (all_reduce_sum(shifted.exp().sum(dim=-1)).log() - picked).masked_fill(ignored, 0.0)
        return losses.sum() / labels.numel()


def flat_tokens_count_every_token(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FlatTokensCountEveryToken(ref, rank, world_size)
