"""Collectives that non-strict export cannot trace on its own.

Non-strict export rewrites the in-place c10d calls listed in
`torch.distributed._functional_collectives.traceable_collective_remaps` into functional
collectives. Broadcast, the list forms of all_to_all / reduce_scatter and every `async_op=True`
call are missing from that table; while capture runs we add them, each lowered to one
functional collective followed by a copy into the caller's buffers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


class _CompletedWork:
    """Stands in for the `Work` handle of an `async_op=True` call: tracing is synchronous."""

    def wait(self, timeout: Any = None) -> bool:
        del timeout
        return True

    def is_completed(self) -> bool:
        return True


def _group(group: Any) -> Any:
    return group if group is not None else dist.group.WORLD


def _broadcast(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    group = _group(group)
    if group_src is None:
        group_src = dist.get_group_rank(group, src)
    tensor.copy_(funcol.broadcast(tensor, group_src, group))
    return _CompletedWork() if async_op else None


def _all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    group = _group(group)
    flat_in = torch.cat([t.reshape(-1) for t in input_tensor_list])
    out = funcol.all_to_all_single(
        flat_in,
        [t.numel() for t in output_tensor_list],
        [t.numel() for t in input_tensor_list],
        group,
    )
    offset = 0
    for target in output_tensor_list:
        target.copy_(out[offset : offset + target.numel()].view_as(target))
        offset += target.numel()
    return _CompletedWork() if async_op else None


def _reduce_scatter_list(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = dist.ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    group = _group(group)
    reduce_op = funcol.REDUCE_OP_TO_STR[op] if not isinstance(op, str) else op
    stacked = torch.cat(input_list, dim=0) if output.dim() > 0 else torch.stack(input_list)
    output.copy_(funcol.reduce_scatter_tensor(stacked, reduce_op, 0, group).view_as(output))
    return _CompletedWork() if async_op else None


def _synchronous(remapped: Callable[..., Any]) -> Callable[..., Any]:
    """Let an existing remap accept `async_op=True` by tracing the call synchronously."""

    def call(*args: Any, async_op: bool = False, **kwargs: Any) -> Any:
        result = remapped(*args, **kwargs)
        return _CompletedWork() if async_op else result

    call.__name__ = remapped.__name__
    return call


@contextlib.contextmanager
def extended_collective_remaps() -> Iterator[None]:
    table = funcol.traceable_collective_remaps
    saved = dict(table)
    try:
        for legacy, remapped in saved.items():
            if legacy not in (dist.isend, dist.irecv, dist.batch_isend_irecv):
                table[legacy] = _synchronous(remapped)
        table[dist.broadcast] = _broadcast
        table[dist.all_to_all] = _all_to_all
        table[dist.reduce_scatter] = _reduce_scatter_list
        yield
    finally:
        table.clear()
        table.update(saved)
