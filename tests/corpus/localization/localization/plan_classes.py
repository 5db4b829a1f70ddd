"""DTensor plans over the user's own module classes (family `plan`): residual blocks whose
attention or gated feed-forward class a plan entry prepares (PrepareModuleInput /
PrepareModuleOutput), and an MLP classifier whose class scores are left sharded. The line to change is
the plan entry, whatever class the planned module is."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    parallelize_module,
)

from .models import GatedMLP, GQAAttention, RMSNorm


class ResidualAttentionBlock(nn.Module):
    """x + attn(norm(x)) with the user's attention and norm classes."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.attn = GQAAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class ResidualGatedBlock(nn.Module):
    """x + ffn(norm(x)) with a gated feed-forward class."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.ffn = GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(self.norm(x))


def residual_attention_block() -> ResidualAttentionBlock:
    return ResidualAttentionBlock()


def residual_gated_block() -> ResidualGatedBlock:
    return ResidualGatedBlock()


def attention_class_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """The attention class defers o_proj's reduction to its own boundary (Partial sums out of
    o_proj, redistributed to Replicate where the attention module's output leaves it)."""
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(output_layouts=Partial()),
        "attn": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate()),
    }
    return parallelize_module(model, mesh, plan)


def gated_ffn_input_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """The feed-forward class's input declared as partial sums to be reduced on the way in."""
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {
        "ffn": PrepareModuleInput(input_layouts=(Partial(),), desired_input_layouts=(Replicate(),)),
        "ffn.gate_proj": ColwiseParallel(),
        "ffn.up_proj": ColwiseParallel(),
        "ffn.down_proj": RowwiseParallel(),
    }
    return parallelize_module(model, mesh, plan)


def classifier_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """An MLP classifier (a softmax over `down`'s classes) with the classes left sharded."""
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {
        "up": ColwiseParallel(),
        "down": RowwiseParallel(output_layouts=Shard(-1)),
    }
    return parallelize_module(model, mesh, plan)
