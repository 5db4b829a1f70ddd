"""Long-context parallelism: DeepSpeed-Ulysses (each rank holds a block of the sequence and swaps
it for a block of the heads with an all-to-all around attention) and context parallelism as
torchtitan / Megatron-core run it without a ring (each rank's queries attend to the all-gathered
keys and values, under the causal mask's rows of its own block, or of its two mirrored blocks
when the sequence is load-balanced). Our own small equivalents."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS


def _gathered_sequence(y: torch.Tensor, world_size: int, dim: int) -> torch.Tensor:
    pieces = [torch.empty_like(y) for _ in range(world_size)]
    dist.all_gather(pieces, y.contiguous())
    return torch.cat(pieces, dim=dim)


class UlyssesAttention(nn.Module):
    """Sequence-sharded projections; all-to-all to [full sequence, local heads] for attention and
    back to [local sequence, every head] for the output projection; the sequence gathered last."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj
        self.rank, self.world_size = rank, world_size

    def _to_heads(self, t: torch.Tensor) -> torch.Tensor:
        """[b, s/p, H, d] -> [b, H/p, s, d]: rank j receives head block j of every rank's rows."""
        b, rows, h, d = t.shape
        p = self.world_size
        send = t.reshape(b, rows, p, h // p, d).permute(2, 1, 0, 3, 4).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)  # [source rank, rows, b, H/p, d]
        return received.reshape(p * rows, b, h // p, d).permute(1, 2, 0, 3)

    def _to_sequence(self, t: torch.Tensor) -> torch.Tensor:
        """[b, H/p, s, d] -> [b, s/p, H * d]: the inverse exchange."""
        b, h, s, d = t.shape
        p = self.world_size
        send = t.reshape(b, h, p, s // p, d).permute(2, 3, 0, 1, 4).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)  # [source rank (head block), rows, b, H/p, d]
        return received.permute(2, 1, 0, 3, 4).reshape(b, s // p, p * h * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        rows = s // self.world_size
        mine = x[:, self.rank * rows : (self.rank + 1) * rows]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return self._to_heads(t.view(b, rows, HEADS, HEAD_DIM))

        q, k, v = heads(self.q_proj(mine)), heads(self.k_proj(mine)), heads(self.v_proj(mine))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        out = self.o_proj(self._to_sequence(probs @ v))
        return _gathered_sequence(out, self.world_size, dim=1)


class SequenceFirstUlyssesAttention(nn.Module):
    """DeepSpeed-Ulysses in its own layout, [seq, batch, heads, dim]: one exchange function for
    both directions, given the dim it scatters and the dim it gathers. Scattering heads, the rows
    of sequence and batch are merged into one dim before the exchange; scattering the sequence, the
    received blocks are moved behind the batch and merged into the heads dim by the final view."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj
        self.rank, self.world_size = rank, world_size

    def _exchange(self, t: torch.Tensor, scatter: int, gather: int) -> torch.Tensor:
        p = self.world_size
        local = list(t.shape)
        local[scatter] //= p
        if scatter < 2:  # the sequence: its blocks lead already
            send = t.reshape([p, local[scatter], *local[scatter + 1 :]]).contiguous()
        else:  # the heads: blocks of heads moved to the front
            send = t.reshape([-1, p, local[scatter], *local[scatter + 1 :]]).transpose(0, 1).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)
        if scatter < 2:  # [source rank, seq / p, batch, heads / p, dim] -> the source's heads behind the batch
            received = received.permute(1, 2, 0, 3, 4).contiguous()
        merged = [*local[:gather], local[gather] * p, *local[gather + 1 :]]
        return received.reshape(merged).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        rows = s // self.world_size
        mine = x[:, self.rank * rows : (self.rank + 1) * rows]

        def heads(t: torch.Tensor) -> torch.Tensor:  # [s/p, b, H, d] -> [b, H/p, s, d]
            local = t.view(b, rows, HEADS, HEAD_DIM).transpose(0, 1)
            return self._exchange(local, scatter=2, gather=0).permute(1, 2, 0, 3)

        q, k, v = heads(self.q_proj(mine)), heads(self.k_proj(mine)), heads(self.v_proj(mine))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        context = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        local = self._exchange(context.permute(2, 0, 1, 3), scatter=0, gather=2)  # [s/p, b, H, d]
        out = self.o_proj(local.transpose(0, 1).reshape(b, rows, HEADS * HEAD_DIM))
        return _gathered_sequence(out, self.world_size, dim=1)


class ContextParallelAttention(nn.Module):
    """Each rank projects its block of the sequence, gathers every rank's keys and values, and
    masks its queries by their global positions (its block's offset added to the row index)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj
        self.rank, self.world_size = rank, world_size

    def blocks(self, length: int) -> list[tuple[int, int]]:
        """The rank's blocks of the sequence, [start, end) each."""
        rows = length // self.world_size
        return [(self.rank * rows, (self.rank + 1) * rows)]

    def gathered(self, y: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's rows gathered back into the sequence's order."""
        return _gathered_sequence(y, self.world_size, dim=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        blocks = self.blocks(s)
        mine = torch.cat([x[:, start:end] for start, end in blocks], dim=1)
        positions = torch.cat([torch.arange(start, end) for start, end in blocks])
        rows = mine.shape[1]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, rows, HEADS, HEAD_DIM).transpose(1, 2)

        q = heads(self.q_proj(mine))
        k = self.gathered(heads(self.k_proj(mine)), dim=2)
        v = self.gathered(heads(self.v_proj(mine)), dim=2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        visible = torch.arange(s)[None, :] <= positions[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out = self.o_proj((probs @ v).transpose(1, 2).reshape(b, rows, HEADS * HEAD_DIM))
        return self.gathered(out, dim=1)


def _gathered_mirrored(y: torch.Tensor, world_size: int, dim: int) -> torch.Tensor:
    """Every rank's [block r; block 2W-1-r] gathered and put back in the sequence's order."""
    pieces = [torch.empty_like(y) for _ in range(world_size)]
    dist.all_gather(pieces, y.contiguous())
    halves = [piece.chunk(2, dim=dim) for piece in pieces]
    return torch.cat([first for first, _ in halves] + [second for _, second in reversed(halves)], dim=dim)


class LoadBalancedContextParallelAttention(ContextParallelAttention):
    """Context parallelism load-balanced for the causal mask (Megatron-core's and Llama 3's
    layout): the sequence cut in 2W blocks, rank r holding blocks r and 2W-1-r, so every rank has
    as many visible keys to attend to; keys and values all-gathered back into the sequence's order,
    the causal mask's rows those of the rank's two blocks."""

    def blocks(self, length: int) -> list[tuple[int, int]]:
        block = length // (2 * self.world_size)
        first, mirror = self.rank * block, (2 * self.world_size - 1 - self.rank) * block
        return [(first, first + block), (mirror, mirror + block)]

    def gathered(self, y: torch.Tensor, dim: int) -> torch.Tensor:
        return _gathered_mirrored(y, self.world_size, dim=dim)


def load_balanced_context_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return LoadBalancedContextParallelAttention(ref, rank, world_size)


def ulysses_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return UlyssesAttention(ref, rank, world_size)


def sequence_first_ulysses_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceFirstUlyssesAttention(ref, rank, world_size)


def context_parallel_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ContextParallelAttention(ref, rank, world_size)


class ContextParallelTokenLoss(nn.Module):
    """Each rank the per-token loss of its block of the sequence (its logits and its labels),
    the blocks all-gathered back along the sequence (Megatron's context parallelism before the
    loss mask's average)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.lm_head, self.rank, self.world_size = ref.lm_head, rank, world_size

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows = x.shape[1] // self.world_size
        mine = slice(self.rank * rows, (self.rank + 1) * rows)
        logits = self.lm_head(x[:, mine])
        losses = F.cross_entropy(logits.transpose(1, 2), targets[:, mine], reduction="none")
        return _gathered_sequence(losses, self.world_size, dim=1)


def context_parallel_token_loss(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ContextParallelTokenLoss(ref, rank, world_size)
