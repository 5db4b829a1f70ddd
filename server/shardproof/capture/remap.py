"""Collectives that non-strict export cannot trace on its own.

Non-strict export rewrites the in-place c10d calls listed in
`torch.distributed._functional_collectives.traceable_collective_remaps` into functional
collectives. Broadcast, the list forms of all_to_all / reduce_scatter and every `async_op=True`
call are missing from that table; while capture runs we add them, each lowered to one
functional collective followed by a copy into the caller's buffers.

Point-to-point calls (send, recv, isend, irecv, batch_isend_irecv: pipeline stages) have no
functional form at all. They become calls of two shardproof ops: a receive is a value from its
peer copied into the caller's buffer, a send gives a token that `sends_as_outputs` adds to the
module's outputs, so the send stays in the graph (export drops what no output needs); the
normalizer makes both one matched `p2p` call and drops the tokens from the outputs again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


@torch.library.custom_op("shardproof::p2p_send", mutates_args=())
def p2p_send(tensor: torch.Tensor, peer: int) -> torch.Tensor:
    """Send `tensor` to global rank `peer`; the result is a token standing for the send."""
    return tensor.clone()


@p2p_send.register_fake
def _(tensor: torch.Tensor, peer: int) -> torch.Tensor:
    return torch.empty_like(tensor)


@torch.library.custom_op("shardproof::p2p_recv", mutates_args=())
def p2p_recv(like: torch.Tensor, peer: int) -> torch.Tensor:
    """Receive a tensor shaped like `like` from global rank `peer`."""
    return torch.empty_like(like)


@p2p_recv.register_fake
def _(like: torch.Tensor, peer: int) -> torch.Tensor:
    return torch.empty_like(like)


_SENT: list[torch.Tensor] = []  # tokens of the sends of the module being traced


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


def _peer(group: Any, peer: int | None, group_peer: int | None) -> int:
    if peer is None and group_peer is not None:
        return dist.get_global_rank(_group(group), group_peer)
    if peer is None:
        raise ValueError("a point-to-point call from or to any rank (src=None) cannot be traced")
    return peer


def _send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: Any = None) -> None:
    del tag
    _SENT.append(p2p_send(tensor, _peer(group, dst, group_dst)))


def _recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: Any = None) -> int:
    del tag
    peer = _peer(group, src, group_src)
    tensor.copy_(p2p_recv(tensor, peer))
    return peer


def _isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: Any = None) -> Any:
    _send(tensor, dst, group, tag, group_dst)
    return _CompletedWork()


def _irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: Any = None) -> Any:
    _recv(tensor, src, group, tag, group_src)
    return _CompletedWork()


def _batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
    """The operations in list order: sends first on one side and receives first on the other
    would deadlock only when run blocking, which the matching of calls between ranks reports."""
    works = []
    for op in p2p_op_list:
        is_send = op.op in (dist.isend, dist.send) or getattr(op.op, "__name__", "") in ("isend", "send")
        peer = getattr(op, "peer", None)
        if is_send:
            works.append(_isend(op.tensor, peer, op.group, op.tag, getattr(op, "group_peer", None)))
        else:
            works.append(_irecv(op.tensor, peer, op.group, op.tag, getattr(op, "group_peer", None)))
    return works


@contextlib.contextmanager
def sends_as_outputs(module: torch.nn.Module) -> Iterator[None]:
    """While `module` is traced, its output carries the tokens of the sends it made."""

    def add_tokens(_module: Any, _args: Any, output: Any) -> Any:
        if not _SENT:
            return output
        tokens = list(_SENT)
        _SENT.clear()
        return (output, *tokens)

    _SENT.clear()
    handle = module.register_forward_hook(add_tokens)
    originals = {name: getattr(dist, name) for name in ("send", "recv", "isend", "irecv", "batch_isend_irecv")}
    replacements = {
        "send": _send,
        "recv": _recv,
        "isend": _isend,
        "irecv": _irecv,
        "batch_isend_irecv": _batch_isend_irecv,
    }
    try:
        for name, replacement in replacements.items():
            setattr(dist, name, replacement)
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
        handle.remove()
        _SENT.clear()


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
