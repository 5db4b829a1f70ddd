"""Collectives with the wrong reduction or group (family `collective`)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, causal_attention


class RowParallelMLP(nn.Module):
    """Megatron ColumnParallelLinear -> GELU -> RowParallelLinear, the bias after the reduction."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(out, op=dist.ReduceOp.AVG)
        return out + self.down_b


def all_reduce_avg(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RowParallelMLP(ref, rank, world_size)


class HeadParallelAttention(nn.Module):
    """GPT-2 attention, heads split over ranks (c_attn per part), c_proj's partial sums reduced."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        parts = ref.c_attn.weight.chunk(3), ref.c_attn.bias.chunk(3)
        self.qkv_w = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in parts[0]]).clone())
        self.qkv_b = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in parts[1]]).clone())
        self.proj_w = nn.Parameter(ref.c_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.proj_b = nn.Parameter(ref.c_proj.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in F.linear(x, self.qkv_w, self.qkv_b).chunk(3, dim=-1))
        out = F.linear(causal_attention(q, k, v), self.proj_w)
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return out + self.proj_b


def attention_all_reduce_max(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return HeadParallelAttention(ref, rank, world_size)


class HeadsReducedToo(HeadParallelAttention):
    """The same attention with one all-reduce too many, on the heads before the projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in F.linear(x, self.qkv_w, self.qkv_b).chunk(3, dim=-1))
        heads = causal_attention(q, k, v)
        dist.all_reduce(heads)
        out = F.linear(heads, self.proj_w)
        dist.all_reduce(out)
        return out + self.proj_b


def heads_reduced_too(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return HeadsReducedToo(ref, rank, world_size)


class VocabParallelSoftmax(nn.Module):
    """Megatron's vocab-parallel softmax: the global max and the global sum of exponentials by
    two all-reduces; each rank keeps its vocabulary block of the probabilities."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        logits_max = logits.amax(dim=-1, keepdim=True)
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        exp = (logits - logits_max).exp()
        sum_exp = exp.sum(dim=-1, keepdim=True)
        dist.all_reduce(sum_exp, op=dist.ReduceOp.MAX)
        return exp / sum_exp


def softmax_sum_as_max(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelSoftmax(ref, rank, world_size)


class TwoDimensionalMLP(nn.Module):
    """Four ranks as 2 tensor-parallel x 2 data-parallel (Megatron's rank layout: tensor-parallel
    ranks adjacent): the MLP sharded over the tensor-parallel pair, replicated over the other."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        tp = 2
        tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        self.tp_group, self.dp_group = tp_groups[rank // tp], dp_groups[rank % tp]
        tp_rank = rank % tp
        self.up_w = nn.Parameter(ref.up.weight.chunk(tp, dim=0)[tp_rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(tp, dim=0)[tp_rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(tp, dim=1)[tp_rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(out, group=self.dp_group)
        return out + self.down_b


def reduce_over_data_parallel_group(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return TwoDimensionalMLP(ref, rank, world_size)


class SequenceParallelMLP(nn.Module):
    """Megatron sequence parallelism: the row-parallel output reduce-scattered along the sequence
    (sequence-first), the blocks all-gathered back for a replicated output."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w).transpose(0, 1).contiguous()
        local = torch.empty((partial.shape[0] // self.world_size, *partial.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(local, partial, op=dist.ReduceOp.MAX)
        full = torch.empty_like(partial)
        dist.all_gather_into_tensor(full, (local + self.down_b).contiguous())
        return full.transpose(0, 1)


def reduce_scatter_max(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceParallelMLP(ref, rank, world_size)


class ReducesItsInput(RowParallelMLP):
    """The all-reduce written on the row-parallel layer's input (already used) instead of its
    output, as a DeepSpeed-style LinearAllreduce written out by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(F.linear(x, self.up_w, self.up_b))
        out = torch.matmul(hidden, self.down_w.t())
        dist.all_reduce(hidden)
        return out + self.down_b


def all_reduce_of_the_input(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ReducesItsInput(ref, rank, world_size)
