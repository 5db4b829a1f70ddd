"""Tensor-parallel communication helpers in the shape of vLLM's `parallel_state` / Megatron's
`mappings` (our own small equivalents): an in-place sum over the group, a gather along the last
dimension through one all_gather_into_tensor buffer."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    world_size = dist.get_world_size()
    out = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return torch.cat(out.chunk(world_size, dim=0), dim=-1)
