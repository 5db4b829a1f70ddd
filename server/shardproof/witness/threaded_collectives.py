"""The collectives torch's threaded process group lacks, emulated exactly from the ones it has.

The numeric witness runs the ranks as threads of one process on torch's threaded process group
(`numeric.py`). That group implements all-reduce for every reduction (SUM, AVG, PRODUCT, MIN, MAX
and the bitwise ones) but:

- reduce-scatter (the list, tensor and functional forms) only with SUM and AVG: a program that
  reduce-scatters with MAX raised `NotImplementedError` instead of showing its numbers;
- reduce-scatter of a tensor in the stacked form (input `[world_size, *output.shape]`) not at all:
  each rank's piece keeps the leading unit dim and cannot be added into the output;
- reduce (to one destination rank) not at all.

Each is emulated here by its definition in terms of an all-reduce with the same operation:

- reduce-scatter: rank `r`'s output is the reduction over the ranks of their piece `r`. The ranks
  all-reduce the concatenation of their flattened pieces; elementwise, block `r` of the result is
  that reduction, and each rank keeps its block (viewed in its output's shape).
- reduce: the destination's tensor becomes the reduction over the ranks; the ranks all-reduce a
  copy and only the destination keeps it (the others' tensors stay as they were, as with NCCL).

The group's own reduce-scatter still runs where it works (SUM and AVG on pieces of the output's
shape), so witnesses of programs it already ran are computed as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

# The reductions the threaded group's own reduce-scatter implements.
_NATIVE_REDUCE_SCATTER = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)


@contextlib.contextmanager
def complete_threaded_collectives() -> Iterator[None]:
    """While active, the threaded process group reduce-scatters with every reduction and in every
    layout its all-reduce supports, and reduces to one rank."""
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    native_reduce_scatter = ProcessLocalGroup.reduce_scatter
    had_reduce = "reduce" in ProcessLocalGroup.__dict__
    native_reduce = ProcessLocalGroup.__dict__.get("reduce")

    def reduce_scatter(self: Any, output_tensor: list[torch.Tensor], scatter_list: Any, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        (output,), (pieces,) = output_tensor, scatter_list
        if opts.reduceOp in _NATIVE_REDUCE_SCATTER and all(p.shape == output.shape for p in pieces):
            return native_reduce_scatter(self, output_tensor, scatter_list, opts)
        return emulated_reduce_scatter(self, output, list(pieces), opts.reduceOp)

    def reduce(self: Any, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceOptions()
        return emulated_reduce(self, tensors, opts.reduceOp, opts.rootRank)

    ProcessLocalGroup.reduce_scatter = reduce_scatter
    ProcessLocalGroup.reduce = reduce
    try:
        yield
    finally:
        ProcessLocalGroup.reduce_scatter = native_reduce_scatter
        if had_reduce:
            ProcessLocalGroup.reduce = native_reduce
        else:
            del ProcessLocalGroup.reduce


def emulated_reduce_scatter(group: Any, output: torch.Tensor, pieces: list[torch.Tensor], op: Any) -> Any:
    """`output` on this rank becomes the reduction with `op` over the ranks of their `pieces[rank]`
    (`group.rank()` is the rank within `group`): an all-reduce of every piece, this rank's block kept."""
    if len(pieces) != group.size():
        raise ValueError(f"reduce-scatter of {len(pieces)} pieces over a group of {group.size()} ranks")
    if any(p.numel() != output.numel() for p in pieces):
        raise ValueError(f"reduce-scatter into {tuple(output.shape)} of pieces {[tuple(p.shape) for p in pieces]}")
    joined = torch.cat([p.detach().reshape(-1) for p in pieces])
    group.allreduce([joined], _allreduce_options(op)).wait()
    mine = joined.split(output.numel())[group.rank()]
    output.detach().copy_(mine.view(output.shape))
    return _done([output])


def emulated_reduce(group: Any, tensors: list[torch.Tensor], op: Any, root: int) -> Any:
    """The reduction with `op` over the ranks, into `tensors` on the group's rank `root` only."""
    reduced = [t.detach().clone() for t in tensors]
    group.allreduce(reduced, _allreduce_options(op)).wait()
    if group.rank() == root:
        for tensor, value in zip(tensors, reduced, strict=True):
            tensor.detach().copy_(value)
    return _done(tensors)


def _allreduce_options(op: Any) -> Any:
    options = dist.AllreduceOptions()
    options.reduceOp = op
    return options


def _done(result: list[torch.Tensor]) -> Any:
    from torch.testing._internal.distributed.multi_threaded_pg import ret_work

    return ret_work(result)
