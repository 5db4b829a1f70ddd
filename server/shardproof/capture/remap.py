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
import torch.distributed.distributed_c10d as c10d

from ..errors import CollectiveMisuse


@torch.library.custom_op("shardproof::p2p_send", mutates_args=())
def p2p_send(tensor: torch.Tensor, peer: int, blocking: bool) -> torch.Tensor:
    """Send `tensor` to global rank `peer` (`blocking`: `send`, which returns once the peer has
    posted its receive; else `isend`); the result is a token standing for the send."""
    return tensor.clone()


@p2p_send.register_fake
def _(tensor: torch.Tensor, peer: int, blocking: bool) -> torch.Tensor:
    return torch.empty_like(tensor)


@torch.library.custom_op("shardproof::p2p_recv", mutates_args=())
def p2p_recv(like: torch.Tensor, peer: int, blocking: bool) -> torch.Tensor:
    """Receive a tensor shaped like `like` from global rank `peer` (`blocking`: `recv`)."""
    return torch.empty_like(like)


@p2p_recv.register_fake
def _(like: torch.Tensor, peer: int, blocking: bool) -> torch.Tensor:
    return torch.empty_like(like)


# A receive whose value the rank never reads still takes part in the exchange (its sender's call
# is matched with it): tracing must not drop it as dead code.
torch.fx.node.has_side_effect(torch.ops.shardproof.p2p_recv.default)


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


def _gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """`dist.gather`: every rank's tensor in `gather_list` on the destination, the others passing
    None. Traced as an all-gather on every rank of the group (each takes part alike), whose pieces
    only the destination keeps: what the destination holds is the same."""
    group = _group(group)
    if group_dst is None:
        group_dst = dist.get_group_rank(group, dst if dst is not None else 0)
    is_destination = dist.get_group_rank(group, dist.get_rank()) == group_dst
    only_there = "give gather_list on the destination rank only (None on the others), as torch requires"
    if gather_list and not is_destination:
        raise CollectiveMisuse("dist.gather: gather_list is given on a rank that is not the destination", only_there)
    gathered = funcol.all_gather_tensor(tensor.contiguous(), 0, group)
    if is_destination:
        if not gather_list:
            raise CollectiveMisuse("dist.gather: the destination rank gives no gather_list", only_there)
        for piece, out in zip(gathered.chunk(len(gather_list)), gather_list, strict=True):
            out.copy_(piece.view_as(out))
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


def _checked_all_to_all_single(remapped: Callable[..., Any]) -> Callable[..., Any]:
    """all_to_all_single whose split sizes are checked as a process group checks them: they must
    add up to the rows of the input and of the output (else every real run fails at this call;
    the functional collective would trace it with a wrongly sized result)."""

    def call(
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None = None,
        input_split_sizes: list[int] | None = None,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        world_size = dist.get_world_size(_group(group))
        for role, tensor, splits in (("input", input, input_split_sizes), ("output", output, output_split_sizes)):
            rows = tensor.shape[0] if tensor.dim() else 1
            if splits:
                if len(splits) != world_size:
                    raise CollectiveMisuse(
                        f"all_to_all_single on rank {dist.get_rank()}: {role}_split_sizes {list(splits)} has "
                        f"{len(splits)} entries for a group of {world_size} ranks"
                    )
                if sum(splits) != rows:
                    other = "output" if role == "input" else "input"
                    raise CollectiveMisuse(
                        f"all_to_all_single on rank {dist.get_rank()}: {role}_split_sizes {list(splits)} add up to "
                        f"{sum(splits)} rows but the {role} has {rows}; this call fails on every process group "
                        f"(are the {role} and {other} split sizes swapped?)"
                    )
            elif rows % world_size:
                raise CollectiveMisuse(
                    f"all_to_all_single on rank {dist.get_rank()} without {role}_split_sizes: the {role}'s {rows} "
                    f"rows do not divide among {world_size} ranks"
                )
        return remapped(output, input, output_split_sizes, input_split_sizes, group, async_op=async_op)

    call.__name__ = "all_to_all_single"
    return call


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
        raise ValueError("a point-to-point call from or to any rank (src=None) cannot be followed")
    return peer


@contextlib.contextmanager
def point_to_point(
    send: Callable[[torch.Tensor, int], None], recv: Callable[[torch.Tensor, int], None], sends_first: bool
) -> Iterator[None]:
    """While the block runs, torch.distributed's send, recv, isend, irecv and batch_isend_irecv
    are `send(tensor, peer, blocking)` and `recv(tensor, peer, blocking)` (peer: a global rank;
    blocking for send and recv, not for the others), synchronous. A batch
    runs in list order, or its sends first with `sends_first` (a receive that blocks must not
    wait on a send of its own batch)."""

    originals = {name: getattr(c10d, name) for name in ("send", "recv", "isend", "irecv", "batch_isend_irecv")}

    def sending(
        tensor: torch.Tensor, dst: Any = None, group: Any = None, tag: int = 0, group_dst: Any = None, *, wait: bool
    ) -> None:
        send(tensor, _peer(group, dst, group_dst), wait)

    def receiving(
        tensor: torch.Tensor, src: Any = None, group: Any = None, tag: int = 0, group_src: Any = None, *, wait: bool
    ) -> int:
        peer = _peer(group, src, group_src)
        recv(tensor, peer, wait)
        return peer

    def send_call(*args: Any, **kwargs: Any) -> None:
        sending(*args, **kwargs, wait=True)

    def recv_call(*args: Any, **kwargs: Any) -> int:
        return receiving(*args, **kwargs, wait=True)

    def isend(*args: Any, **kwargs: Any) -> _CompletedWork:
        sending(*args, **kwargs, wait=False)
        return _CompletedWork()

    def irecv(*args: Any, **kwargs: Any) -> _CompletedWork:
        receiving(*args, **kwargs, wait=False)
        return _CompletedWork()

    def is_send(op: Any) -> bool:
        return op.op in (isend, send_call, originals["isend"], originals["send"])

    def peer_of(op: Any) -> int:
        return _peer(op.group, op.peer, getattr(op, "group_peer", None))

    def from_lower_rank(op: Any) -> bool:
        """Whether `op` moves a value from the lower of its two ranks to the higher."""
        return is_send(op) == (dist.get_rank() < peer_of(op))

    def batch_isend_irecv(p2p_op_list: list[Any]) -> list[_CompletedWork]:
        if sends_first:
            ops = sorted(p2p_op_list, key=lambda op: not is_send(op))
        else:
            # A batch's calls run at once: two ranks that send to each other in one batch must
            # pair up whatever order each listed its calls in. Calls are matched in order per
            # pair of ranks, so both ranks list the value moving from the lower rank first.
            ops = sorted(p2p_op_list, key=lambda op: not from_lower_rank(op))
        return [
            (isend if is_send(op) else irecv)(op.tensor, op.peer, op.group, op.tag, getattr(op, "group_peer", None))
            for op in ops
        ]

    replacements = {
        "send": send_call,
        "recv": recv_call,
        "isend": isend,
        "irecv": irecv,
        "batch_isend_irecv": batch_isend_irecv,
    }
    # both modules: P2POp accepts only the isend / irecv of distributed_c10d
    modules = (dist, c10d)
    try:
        for module in modules:
            for name, replacement in replacements.items():
                setattr(module, name, replacement)
        yield
    finally:
        for module in modules:
            for name, original in originals.items():
                setattr(module, name, original)


@contextlib.contextmanager
def sends_as_outputs(module: torch.nn.Module) -> Iterator[None]:
    """While `module` is traced, its point-to-point calls are the shardproof ops and its output
    carries the tokens of the sends it made."""

    def add_tokens(_module: Any, _args: Any, output: Any) -> Any:
        if not _SENT:
            return output
        tokens = list(_SENT)
        _SENT.clear()
        return (output, *tokens)

    def send(tensor: torch.Tensor, peer: int, blocking: bool) -> None:
        _SENT.append(p2p_send(tensor, peer, blocking))

    def recv(tensor: torch.Tensor, peer: int, blocking: bool) -> None:
        tensor.copy_(p2p_recv(tensor, peer, blocking))

    _SENT.clear()
    handle = module.register_forward_hook(add_tokens)
    try:
        with point_to_point(send, recv, sends_first=False):
            yield
    finally:
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
    # torch.distributed.nn.functional's differentiable collectives refuse to run while compiling
    # (export counts as compiling); their forward is a copy and the in-place collective, which
    # the remaps above make traceable
    from torch.distributed.nn import functional as differentiable

    refusal = getattr(differentiable, "_not_supported_under_compile", None)
    if refusal is not None:
        differentiable._not_supported_under_compile = lambda *args, **kwargs: None
    try:
        for legacy, remapped in saved.items():
            if legacy not in (dist.isend, dist.irecv, dist.batch_isend_irecv):
                table[legacy] = _synchronous(remapped)
        table[dist.broadcast] = _broadcast
        table[dist.all_to_all] = _all_to_all
        table[dist.gather] = _gather
        if dist.all_to_all_single in table:
            table[dist.all_to_all_single] = _checked_all_to_all_single(table[dist.all_to_all_single])
        table[dist.reduce_scatter] = _reduce_scatter_list
        yield
    finally:
        table.clear()
        table.update(saved)
        if refusal is not None:
            differentiable._not_supported_under_compile = refusal
