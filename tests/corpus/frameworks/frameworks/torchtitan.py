"""torchtitan's tensor and sequence parallel plans (models/llama3/infra/parallelize.py, apply_tp)
on a one-layer Llama, by DTensor `parallelize_module`; and its loss parallelism (the output
projection's logits kept vocabulary-sharded, the cross entropy under `loss_parallel()`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from .models import Llama


def _blocks(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Each block's plan: q/k/v and w1/w3 colwise, wo and w2 rowwise; with sequence parallelism the
    norms run on sequence shards and the attention and feed-forward inputs are gathered first."""
    out = Shard(1) if sequence_parallel else Replicate()
    for block in model.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=out),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=out),
            "feed_forward.w3": ColwiseParallel(),
        }
        if sequence_parallel:
            plan |= {
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            }
        parallelize_module(block, mesh, plan)


def tensor_parallel(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    del rank  # DTensor reads it from the process group
    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        },
    )
    _blocks(model, mesh, sequence_parallel=False)
    return model


def sequence_parallel(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    _blocks(model, mesh, sequence_parallel=True)
    return model


class LossParallel(nn.Module):
    """The training step's loss: logits stay a DTensor sharded over the vocabulary and
    `F.cross_entropy` runs under `loss_parallel()` (torchtitan's `loss_parallel` option)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = Llama.forward(self.model, ids)
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))
        return loss.full_tensor() if isinstance(loss, DTensor) else loss


def loss_parallel_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        },
    )
    _blocks(model, mesh, sequence_parallel=False)
    return LossParallel(model)
