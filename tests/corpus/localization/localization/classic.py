"""The classic tensor-parallel mistakes (family `classic`), in Megatron / vLLM / fairscale style
layers written out per rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum, gather_last_dim
from .models import VOCAB


class ColumnRowMLP(nn.Module):
    """Column-parallel up (weight and bias rows), row-parallel down (weight columns, full bias)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, self.up_w, self.up_b))


class MissingReduceMLP(ColumnRowMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden(x), self.down_w) + self.down_b


def missing_all_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MissingReduceMLP(ref, rank, world_size)


class RowParallelLinear(nn.Module):
    """Megatron RowParallelLinear(reduce_results=True): reduces its own output, then the bias."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(F.linear(x, self.weight)) + self.bias


class DoubleReduceMLP(ColumnRowMLP):
    """The caller reduces the RowParallelLinear's output again (as if reduce_results were False)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.down = RowParallelLinear(ref.down, rank, world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(self.down(self.hidden(x)))


def duplicate_all_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return DoubleReduceMLP(ref, rank, world_size)


class BiasInsideReduceMLP(ColumnRowMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = all_reduce_sum(F.linear(self.hidden(x), self.down_w, self.down_b))
        return out


def bias_before_all_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BiasInsideReduceMLP(ref, rank, world_size)


class NextShardMLP(ColumnRowMLP):
    """up's weight taken from the next rank's block; its bias and down's columns from its own."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[(rank + 1) % world_size].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(F.linear(self.hidden(x), self.down_w)) + self.down_b


def shard_index_plus_one(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return NextShardMLP(ref, rank, world_size)


class SameShardSwiGLU(nn.Module):
    """A SwiGLU MLP: gate and up column-parallel, down row-parallel."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(ref.gate_proj.weight.chunk(world_size, dim=0)[0].clone())
        self.up = nn.Parameter(ref.up_proj.weight.chunk(world_size, dim=0)[rank].clone())
        self.down = nn.Parameter(ref.down_proj.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(F.linear(F.silu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down))


def same_shard_every_rank(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SameShardSwiGLU(ref, rank, world_size)


class GatherOutputMLP(nn.Module):
    """Megatron ColumnParallelLinear(gather_output=True) for up, then a replicated down."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down = ref.down


class ReversedGatherMLP(GatherOutputMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.up_w, self.up_b).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        h = torch.cat(parts[::-1], dim=-1)
        return self.down(F.gelu(h))


def gather_reversed_order(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ReversedGatherMLP(ref, rank, world_size)


class FlatGatherMLP(GatherOutputMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.up_w, self.up_b).contiguous()
        gathered = torch.empty(
            (self.world_size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device
        )
        dist.all_gather_into_tensor(gathered, local)
        h = gathered.reshape(*local.shape[:-1], -1)
        return self.down(F.gelu(h))


def gather_wrong_dim(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FlatGatherMLP(ref, rank, world_size)


class MegatronVocabEmbedding(nn.Module):
    """Megatron VocabParallelEmbedding: ids outside [start, end) masked, shifted, looked up, the
    masked rows zeroed, all-reduced."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        block = VOCAB // world_size
        self.start, self.end = rank * block, (rank + 1) * block
        self.weight = nn.Parameter(ref.embed_tokens.weight[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        input_mask = (ids <= self.start) | (ids >= self.end)
        masked = ids.clone() - self.start
        masked[input_mask] = 0
        out = F.embedding(masked, self.weight)
        out[input_mask, :] = 0.0
        return all_reduce_sum(out)


def vocab_mask_bounds(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MegatronVocabEmbedding(ref, rank, world_size)


class ClampedVocabEmbedding(MegatronVocabEmbedding):
    """The ids shifted and clamped into the rank's rows, looked up, and the rows of ids outside
    them zeroed after the lookup (the mask's upper comparison written with `>`)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids > self.end)
        local = (ids - self.start).clamp(0, self.weight.shape[0] - 1)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return all_reduce_sum(out)


def clamped_vocab_mask_bound(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ClampedVocabEmbedding(ref, rank, world_size)


class ColumnParallelSoftmax(nn.Module):
    """A column-parallel LM head (vocabulary rows) whose output feeds a replicated softmax."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local_logits = F.linear(x, self.weight)
        return gather_last_dim(F.softmax(local_logits, dim=-1))


def softmax_before_gather(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ColumnParallelSoftmax(ref, rank, world_size)


class SplitInputRowParallel(nn.Module):
    """Megatron RowParallelLinear(input_is_parallel=False) for down after a replicated up: the
    layer splits its input along the last dim itself."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.up = ref.up
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x))
        h_local = h.chunk(self.world_size, dim=-1)[self.world_size - 1 - self.rank]
        return all_reduce_sum(F.linear(h_local, self.down_w)) + self.down_b


def row_input_reversed_split(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SplitInputRowParallel(ref, rank, world_size)
