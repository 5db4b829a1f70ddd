"""Megatron's vocabulary-parallel z-loss and label-smoothed cross entropy with their last step
written as other code bases write it: the squared logsumexp as a coefficient times a product
(`coef * lse * lse`) or through `square()`, and the smoothing term subtracted with its difference
reversed (`- eps * (mean_logits - log_z)`, ColossalAI / OpenRLHF style) where Megatron adds
`eps * (log_z - mean_logits)`. Our own small equivalents."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .layer_variants import LABEL_SMOOTHING, Z_LOSS
from .megatron import SmoothedVocabParallelLoss, VocabParallelZLoss, smoothing_terms


def _logsumexp(logits: torch.Tensor) -> torch.Tensor:
    logits_max = torch.max(logits, dim=-1)[0]
    dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
    sum_exp = (logits - logits_max.unsqueeze(dim=-1)).exp().sum(dim=-1)
    dist.all_reduce(sum_exp)
    return torch.log(sum_exp) + logits_max


class ZLossAsProduct(VocabParallelZLoss):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lse = _logsumexp(F.linear(x, self.weight))
        return Z_LOSS * lse * lse


class ZLossSquared(VocabParallelZLoss):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Z_LOSS * _logsumexp(F.linear(x, self.weight)).square()


class SmoothingSubtracted(SmoothedVocabParallelLoss):
    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss, log_z, sum_shifted = smoothing_terms(F.linear(x, self.weight), targets)
        smoothed = (1 - LABEL_SMOOTHING) * loss - LABEL_SMOOTHING * (sum_shifted / self.vocab - log_z)
        return smoothed.mean()


def z_loss_as_product(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ZLossAsProduct(ref, rank, world_size)


def z_loss_squared(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ZLossSquared(ref, rank, world_size)


def smoothing_subtracted(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SmoothingSubtracted(ref, rank, world_size)
