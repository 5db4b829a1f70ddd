"""Run any rank of a parallel program in this one process, on torch's fake process group.

The fake backend accepts meta tensors and FakeTensors, returns immediately, and leaves data
untouched: exactly what capture needs. Libraries keep global parallel state (fairscale's model
parallel groups, Megatron's parallel_state); `libraries` sets it up for each rank and clears it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch.distributed as dist

from .libraries import initialise_libraries, library_shims, reset_libraries


def _destroy_if_initialized() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int) -> Iterator[None]:
    """Make this process rank `rank` of a `world_size`-rank fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _destroy_if_initialized()
    reset_libraries()
    with keep_excepthook():
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        with library_shims():
            initialise_libraries(world_size)
            yield
    finally:
        reset_libraries()
        _destroy_if_initialized()


@contextlib.contextmanager
def keep_excepthook() -> Iterator[None]:
    """`init_process_group` wraps `sys.excepthook` to prefix tracebacks with "[rank<r>]:", once per
    call: in a process that plays every rank many times the prefixes pile up on every later error."""
    hook = sys.excepthook
    try:
        yield
    finally:
        sys.excepthook = hook


def group_ranks(group_name: str) -> tuple[int, ...]:
    """Global ranks of a process group named in a functional collective (must run in the rank context)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(group_name)
    return tuple(dist.get_process_group_ranks(group))
