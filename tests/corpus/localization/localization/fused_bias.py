"""A fused [gate; up] projection with a bias (ChatGLM's dense_h_to_4h and its swiglu), sharded in
place on the reference module (family `fused`, added case): weight and bias must each be cut per
part, each rank taking its block of gate and its block of up."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import FFN, HIDDEN


def swiglu(x: torch.Tensor) -> torch.Tensor:
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


class ChatGLMMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense_h_to_4h = nn.Linear(HIDDEN, 2 * FFN)
        self.dense_4h_to_h = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(swiglu(self.dense_h_to_4h(x)))


def chatglm_mlp() -> ChatGLMMLP:
    return ChatGLMMLP()


def _reduce_output(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(output)
    return output


def shard_in_place(mlp: nn.Module, rank: int, world_size: int) -> None:
    """The fused projection's weight and bias cut by one loop, the output projection by columns."""
    for param in (mlp.dense_h_to_4h.weight, mlp.dense_h_to_4h.bias):
        param.data = param.data.chunk(world_size, dim=0)[rank].clone()
    mlp.dense_4h_to_h.weight.data = mlp.dense_4h_to_h.weight.data.chunk(world_size, dim=1)[rank].clone()


def chatglm_fused_rows(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    shard_in_place(ref, rank, world_size)
    ref.dense_4h_to_h.register_forward_hook(_reduce_output)
    return ref
