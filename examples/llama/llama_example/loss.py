"""The training loss of the tensor-parallel example, computed on logits sharded over the vocabulary.

The output projection is column-parallel without the final gather: each rank holds the logits of
its vocabulary shard [start, start + V / world_size). The cross entropy is then computed as
Megatron's and fairscale's vocab-parallel cross entropy do: the max over the vocabulary (a local
max, all-reduced with MAX), the shifted logits' exponentials summed locally and all-reduced, the
target's logit picked on the rank that holds it (zero elsewhere) and all-reduced, and, for label
smoothing, the sum of the shifted logits all-reduced and divided by the whole vocabulary size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .model import LlamaConfig, LlamaWithLoss
from .tp import ParallelLlama
from .tp import parallelize as parallelize_model


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """The largest value over the tensor-parallel ranks."""
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, vocab_size: int, label_smoothing: float
) -> torch.Tensor:
    """Per-token cross entropy of logits sharded over the vocabulary (this rank: classes
    [vocab_start, vocab_start + logits.shape[-1]) of vocab_size)."""
    local_size = logits.shape[-1]
    vocab_end = vocab_start + local_size
    logits_max = all_reduce_max(logits.amax(dim=-1))
    shifted = logits - logits_max.unsqueeze(-1)
    outside = (targets < vocab_start) | (targets >= vocab_end)
    local_targets = (targets - vocab_start).masked_fill(outside, 0)
    predicted = shifted.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1)
    predicted = all_reduce_sum(predicted.masked_fill(outside, 0.0))
    sum_exp = all_reduce_sum(shifted.exp().sum(dim=-1))
    loss = torch.log(sum_exp) - predicted
    if label_smoothing:
        sum_logits = all_reduce_sum(shifted.sum(dim=-1))
        uniform = torch.log(sum_exp) - sum_logits / vocab_size
        loss = (1.0 - label_smoothing) * loss + label_smoothing * uniform
    return loss


class ParallelLlamaWithLoss(ParallelLlama):
    """The tensor-parallel model whose logits stay sharded over the vocabulary, and its loss."""

    def __init__(self, cfg: LlamaConfig, rank: int, world_size: int) -> None:
        super().__init__(cfg, rank, world_size)
        self.output.gather_output = False
        self.vocab_size = cfg.vocab_size
        self.vocab_start = rank * (cfg.vocab_size // world_size)
        self.label_smoothing = 0.0

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = super().forward(tokens)
        loss = vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.vocab_size, self.label_smoothing)
        return loss.mean()


def parallelize(reference: LlamaWithLoss, rank: int, world_size: int) -> ParallelLlamaWithLoss:
    """This rank's tensor-parallel model (see tp.py) with its vocab-parallel loss."""
    model = parallelize_model(reference, rank, world_size, model_class=ParallelLlamaWithLoss)
    assert isinstance(model, ParallelLlamaWithLoss)
    model.label_smoothing = reference.label_smoothing
    return model
