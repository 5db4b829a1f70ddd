"""gpt-fast's tp.py: the reference modules sharded in place (each weight replaced by its slice,
the head counts divided), the all-reduce a forward hook on the block calling the functional
collective `funcol.all_reduce`. Our own small equivalent, nothing copied from its code."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


def _shard_linear(linear: nn.Linear, dim: int, rank: int, world_size: int, sections: list[int] | None = None) -> None:
    """Replace the weight by rank's slice of `dim`; a fused weight of `sections` is sliced per section."""
    weight = linear.weight
    parts = weight.split(sections, dim=dim) if sections else [weight]
    shard = torch.cat([torch.tensor_split(part, world_size, dim=dim)[rank] for part in parts], dim=dim)
    linear.weight = nn.Parameter(shard.clone(), requires_grad=False)


def _all_reduce_output(module: nn.Module) -> None:
    module.register_forward_hook(lambda _module, _input, output: funcol.all_reduce(output, "sum", dist.group.WORLD))


def feed_forward(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """The SwiGLU block: gate and up sharded by rows, down by columns, the hook on the block."""
    _shard_linear(model.gate_proj, 0, rank, world_size)
    _shard_linear(model.up_proj, 0, rank, world_size)
    _shard_linear(model.down_proj, 1, rank, world_size)
    _all_reduce_output(model)
    return model


def attention(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """The fused wqkv sharded per section ([q; k; v], each by rows), wo by columns, the head
    counts and dim divided by the world size (gpt-fast requires the kv heads to divide)."""
    assert model.n_local_heads % world_size == 0
    q_size, kv_size = model.n_head * model.head_dim, model.n_local_heads * model.head_dim
    _shard_linear(model.wqkv, 0, rank, world_size, sections=[q_size, kv_size, kv_size])
    _shard_linear(model.wo, 1, rank, world_size)
    model.n_head //= world_size
    model.dim //= world_size
    model.n_local_heads //= world_size
    _all_reduce_output(model)
    return model
