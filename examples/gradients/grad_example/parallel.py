"""Tensor-, sequence- and data-parallel versions of the example model, written the Megatron way.

Collectives sit in autograd functions whose backward is the collective's transpose: copying an
activation into the tensor-parallel region all-reduces its gradient, reducing out of it passes
the gradient through; a sequence gather reduce-scatters the gradient and the other way round.
With sequence parallelism each rank normalises its own tokens, so the norm weights' gradients
are partial sums until `finish_gradients` all-reduces them (Megatron's
`_allreduce_layernorm_grads`).

Data parallelism replicates the model and gives every rank its block of the batch: each rank's
loss is the mean over its own items, and the gradients are averaged over the ranks after backward
(DDP). With gradient accumulation a rank runs its block as micro-batches, each loss the sum over
the micro-batch divided by the rank's item count, so the accumulated gradient is the rank's mean.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .model import Config, RMSNorm, WithLoss


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x)
    return x


def _gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Every rank's block, concatenated along `dim` in rank order."""
    world_size = dist.get_world_size()
    gathered = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(gathered, x.contiguous())
    return torch.cat(gathered.chunk(world_size, dim=0), dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's block along `dim` of the sum over ranks."""
    world_size = dist.get_world_size()
    by_rank = torch.cat(x.chunk(world_size, dim=dim), dim=0).contiguous()
    out = torch.empty((by_rank.shape[0] // world_size, *by_rank.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, by_rank)
    return out


def _own_block(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.chunk(dist.get_world_size(), dim=dim)[dist.get_rank()].contiguous()


class CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; the gradient is the sum of every rank's (each saw the whole input)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _all_reduce(grad)


class ReduceFromTensorParallel(torch.autograd.Function):
    """Sum of the ranks' partial results; the gradient passes through."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _all_reduce(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class GatherFromTensorParallel(torch.autograd.Function):
    """The ranks' blocks of the last dim, concatenated; the gradient is the rank's own block."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _gather(x, -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _own_block(grad, -1)


class ScatterToSequenceParallel(torch.autograd.Function):
    """The rank's block of the sequence; the gradient is gathered back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _own_block(x, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _gather(grad, 1)


class GatherFromSequenceParallel(torch.autograd.Function):
    """The whole sequence from the ranks' blocks; the gradient is reduce-scattered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _gather(x, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter(grad, 1)


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """The rank's sequence block of the sum of partial results; the gradient is gathered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter(x, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _gather(grad, 1)


def into_tensor_parallel(x: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """Enter a tensor-parallel region: gather the sequence blocks, or copy the replicated value."""
    if sequence_parallel:
        return GatherFromSequenceParallel.apply(x)
    return CopyToTensorParallel.apply(x)


class ParallelBlock(nn.Module):
    def __init__(self, cfg: Config, world_size: int, sequence_parallel: bool) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.norm = RMSNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, cfg.ffn_dim // world_size, bias=False)  # column-parallel
        self.down = nn.Linear(cfg.ffn_dim // world_size, cfg.dim, bias=False)  # row-parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = into_tensor_parallel(self.norm(x), self.sequence_parallel)
        partial = self.down(F.silu(self.up(h)))
        if self.sequence_parallel:
            return x + ReduceScatterToSequenceParallel.apply(partial)
        return x + ReduceFromTensorParallel.apply(partial)


class ParallelMLPModel(nn.Module):
    def __init__(self, cfg: Config, world_size: int, sequence_parallel: bool) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(ParallelBlock(cfg, world_size, sequence_parallel) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size // world_size, bias=False)  # column-parallel, frozen
        self.head.weight.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.sequence_parallel:
            x = ScatterToSequenceParallel.apply(x)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        x = into_tensor_parallel(x, self.sequence_parallel)
        return GatherFromTensorParallel.apply(self.head(x))


def shard(weight: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous 1/world_size block of `weight` along `dim`."""
    return weight.chunk(world_size, dim=dim)[rank]


@torch.no_grad()
def _load(model: ParallelMLPModel, reference: WithLoss, rank: int, world_size: int) -> None:
    ref = reference.model
    model.embed.weight.copy_(ref.embed.weight)
    for layer, ref_layer in zip(model.layers, ref.layers, strict=True):
        layer.norm.weight.copy_(ref_layer.norm.weight)
        layer.up.weight.copy_(shard(ref_layer.up.weight, 0, rank, world_size))
        layer.down.weight.copy_(shard(ref_layer.down.weight, 1, rank, world_size))
    model.norm.weight.copy_(ref.norm.weight)
    model.head.weight.copy_(shard(ref.head.weight, 0, rank, world_size))


def parallelize_tp(reference: WithLoss, rank: int, world_size: int) -> WithLoss:
    """Tensor parallelism: column- and row-parallel MLPs, replicated norms and embedding."""
    model = ParallelMLPModel(reference.model.cfg, world_size, sequence_parallel=False)
    _load(model, reference, rank, world_size)
    return WithLoss(model)


def parallelize_sp(reference: WithLoss, rank: int, world_size: int) -> WithLoss:
    """Tensor parallelism with the norms on sequence blocks between the parallel regions."""
    model = ParallelMLPModel(reference.model.cfg, world_size, sequence_parallel=True)
    _load(model, reference, rank, world_size)
    return WithLoss(model)


def finish_gradients(model: nn.Module) -> None:
    """Sum the norm weights' partial gradients over the ranks (each normalised its own tokens)."""
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight") and parameter.grad is not None:
            dist.all_reduce(parameter.grad)


def reference_step(model: WithLoss, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = model(tokens, targets)
    loss.backward()
    return loss.detach()


def sequence_parallel_step(model: WithLoss, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = model(tokens, targets)
    loss.backward()
    finish_gradients(model)
    return loss.detach()


def parallelize_dp(reference: WithLoss, rank: int, world_size: int) -> WithLoss:
    """Data parallelism: every rank holds the whole model."""
    return copy.deepcopy(reference)


def _own_examples(*batch: torch.Tensor) -> list[torch.Tensor]:
    """This rank's block of every batch tensor (the batch is dim 0)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    return [x.chunk(world_size)[rank] for x in batch]


def average_gradients(model: nn.Module) -> None:
    """The mean over the ranks of every gradient (each rank's is the gradient of its own mean loss)."""
    world_size = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad.div_(world_size)


def data_parallel_step(model: WithLoss, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    tokens, targets = _own_examples(tokens, targets)
    loss = model(tokens, targets)
    loss.backward()
    average_gradients(model)
    loss = loss.detach()
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return loss


MICRO_BATCHES = 2


def accumulation_step(model: WithLoss, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Gradient accumulation: the rank's block in micro-batches, one backward each."""
    tokens, targets = _own_examples(tokens, targets)
    items = targets.numel()
    losses = []
    for micro_tokens, micro_targets in zip(tokens.chunk(MICRO_BATCHES), targets.chunk(MICRO_BATCHES), strict=True):
        logits = model.model(micro_tokens)
        loss = (logits - micro_targets).pow(2).sum() / items
        loss.backward()
        losses.append(loss.detach())
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.AVG)
    loss = sum(losses)
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return loss
