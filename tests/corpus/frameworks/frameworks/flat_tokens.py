"""Token-level losses over a vocabulary-sharded LM head. ColossalAI's shardformer
(`dist_cross_entropy`) and simple vocabulary-parallel losses view the logits as [tokens, vocab / p]
and the labels as [tokens] before the vocabulary-parallel steps, where Megatron keeps [seq, batch,
vocab / p]; verl's entropy of the token distribution is computed from the same all-reduced max and
sums. Our own small equivalents, nothing copied."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HIDDEN, VOCAB

IGNORE_INDEX = -100


def _flat_tokens_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token loss of the rank's vocabulary shard, on tokens flattened first: the max
    all-reduced with MAX, the label's logit gathered by its local index (zero off the rank's
    shard) and all-reduced, the exponentials' sum all-reduced."""
    rank, partition = dist.get_rank(), logits.shape[-1]
    logits, labels = logits.reshape(-1, partition), labels.reshape(-1)
    start = rank * partition
    largest = logits.max(dim=-1).values
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    shifted = logits - largest.unsqueeze(-1)
    off_shard = (labels < start) | (labels >= start + partition)
    local = (labels - start).masked_fill(off_shard, 0)
    picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(off_shard, 0.0)
    dist.all_reduce(picked)
    summed = shifted.exp().sum(dim=-1)
    dist.all_reduce(summed)
    return summed.log() - picked


class FlatTokensVocabParallelLoss(nn.Module):
    """The LM head column-parallel without gather and the flattened-token loss, averaged over
    every token."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return _flat_tokens_cross_entropy(F.linear(x, self.weight), labels).mean()


class FlatTokensIgnoringLoss(FlatTokensVocabParallelLoss):
    """The same loss zeroed where the label is the ignore index and averaged over the tokens not
    ignored (ColossalAI divides by their count)."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses = _flat_tokens_cross_entropy(F.linear(x, self.weight), labels)
        ignored = labels.reshape(-1) == IGNORE_INDEX
        return losses.masked_fill(ignored, 0.0).sum() / (~ignored).sum()


def flat_tokens_cross_entropy(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FlatTokensVocabParallelLoss(ref, rank, world_size)


def flat_tokens_ignoring_cross_entropy(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FlatTokensIgnoringLoss(ref, rank, world_size)


class TokenEntropy(nn.Module):
    """The reference of an RL trainer's entropy bonus: each token's entropy of the LM head's
    distribution, logsumexp minus the softmax-weighted logits."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x)
        return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


class VocabParallelEntropy(nn.Module):
    """verl's vocabulary-parallel entropy: the max all-reduced with MAX, the shifted exponentials'
    sum and their logit-weighted sum each all-reduced, the weighted sum divided by the sum after
    (the dims kept throughout)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        largest = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        exps = (logits - largest).exp()
        summed = exps.sum(dim=-1, keepdim=True)
        dist.all_reduce(summed)
        weighted = (exps * logits).sum(dim=-1, keepdim=True)
        dist.all_reduce(weighted)
        return (largest + summed.log() - weighted / summed).squeeze(-1)


def token_entropy() -> TokenEntropy:
    return TokenEntropy()


def vocab_parallel_entropy(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelEntropy(ref, rank, world_size)


class FlatTokensMLP(nn.Module):
    """vLLM's layers on tokens flattened to [tokens, hidden]: a column-parallel up projection with
    its bias, GELU, a row-parallel down projection all-reduced, its bias after; the output viewed
    back to the batch's shape."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_weight = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_bias = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_weight = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_bias = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        out = F.linear(F.gelu(F.linear(tokens, self.up_weight, self.up_bias)), self.down_weight)
        dist.all_reduce(out)
        return (out + self.down_bias).view(x.shape)


def flat_tokens_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FlatTokensMLP(ref, rank, world_size)
