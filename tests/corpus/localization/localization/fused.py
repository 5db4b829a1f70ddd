"""Fused weights (family `fused`): a [gate; up] or [q; k; v] weight must be sharded per part,
each rank taking its block of every part; taking one contiguous block of the whole fused weight
gives rank 0 all of gate (or q) and the last rank all of up (or v)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum
from .models import HEAD_DIM, HEADS, HIDDEN, KV_HEADS, causal_attention

SECTIONS = [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]


class MergedColumnSwiGLU(nn.Module):
    """vLLM MergedColumnParallelLinear: the checkpoint's gate and up stacked into gate_up_proj,
    each rank [gate shard; up shard]; SiluAndMul; down_proj row-parallel."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        checkpoint = torch.cat([ref.gate_proj.weight, ref.up_proj.weight])  # gate_up_proj as stored
        self.gate_up = nn.Parameter(checkpoint.chunk(world_size, dim=0)[rank].clone())
        self.down = nn.Parameter(ref.down_proj.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return all_reduce_sum(F.linear(F.silu(gate) * up, self.down))


def merged_gate_up(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MergedColumnSwiGLU(ref, rank, world_size)


def _reduce_output(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(output)
    return output


def phi3_gate_up(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    """gpt-fast style: the reference's own Linears sliced in place, an all-reduce hook on down_proj."""
    fused = ref.gate_up_proj.weight
    ref.gate_up_proj.weight = nn.Parameter(fused.chunk(world_size, dim=0)[rank].clone())
    ref.down_proj.weight = nn.Parameter(ref.down_proj.weight.chunk(world_size, dim=1)[rank].clone())
    ref.down_proj.register_forward_hook(_reduce_output)
    return ref


class WqkvAttention(nn.Module):
    """gpt-fast's wqkv sharded into a new module: q, k, v split by the local section sizes."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        w = ref.wqkv.weight
        self.wqkv = nn.Parameter(w.chunk(world_size, dim=0)[rank].clone())
        self.sizes = [size // world_size for size in SECTIONS]
        self.wo = nn.Parameter(ref.wo.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in F.linear(x, self.wqkv).split(self.sizes, dim=-1))
        return all_reduce_sum(F.linear(causal_attention(q, k, v), self.wo))


def wqkv_one_block(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return WqkvAttention(ref, rank, world_size)


def load_fused_qkv(param: torch.Tensor, loaded: torch.Tensor, rank: int, world_size: int) -> None:
    """A weight loader for GPT-2's c_attn ([q; k; v] rows): the rank's rows copied into `param`."""
    shard = loaded.shape[0] // world_size
    with torch.no_grad():
        param.copy_(loaded.narrow(0, rank * shard, shard))


class CAttnParallel(nn.Module):
    """GPT-2 attention, c_attn column-parallel per part, c_proj row-parallel with its bias after
    the all-reduce. `bias_one_block` takes the fused bias as one block (family `fused`)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, loader: bool) -> None:
        super().__init__()
        rows = 3 * HEADS * HEAD_DIM // world_size
        self.qkv_w = nn.Parameter(torch.zeros(rows, HIDDEN))
        if loader:
            load_fused_qkv(self.qkv_w, ref.c_attn.weight, rank, world_size)
            self.qkv_b = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in ref.c_attn.bias.chunk(3)]).clone())
        else:
            with torch.no_grad():
                self.qkv_w.copy_(torch.cat([p.chunk(world_size)[rank] for p in ref.c_attn.weight.chunk(3)]))
            self.qkv_b = nn.Parameter(ref.c_attn.bias.chunk(world_size)[rank].clone())
        self.proj_w = nn.Parameter(ref.c_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.proj_b = nn.Parameter(ref.c_proj.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in F.linear(x, self.qkv_w, self.qkv_b).chunk(3, dim=-1))
        return all_reduce_sum(F.linear(causal_attention(q, k, v), self.proj_w)) + self.proj_b


def c_attn_loader_one_block(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return CAttnParallel(ref, rank, world_size, loader=True)


def c_attn_bias_one_block(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return CAttnParallel(ref, rank, world_size, loader=False)
