"""Positions and heads: Bloom-style ALiBi attention (a per-head slope on the key position, the
scores through `baddbmm`), whose slopes each rank must take for its own heads; and context
parallelism (each rank's block of queries against the all-gathered keys and values), whose causal
mask must use the global positions of the rank's queries."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN


def alibi_slopes(heads: int) -> torch.Tensor:
    base = 2.0 ** (-(2.0 ** -(math.log2(heads) - 3)))
    return base ** torch.arange(1, heads + 1, dtype=torch.get_default_dtype())


class AlibiAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.dense = nn.Linear(HIDDEN, HIDDEN)
        self.heads = HEADS
        self.slopes = alibi_slopes(HEADS)

    def scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        fused = self.qkv(x).view(b, s, self.heads, 3, HEAD_DIM)
        q, k, v = (fused[..., i, :].transpose(1, 2).reshape(b * self.heads, s, HEAD_DIM) for i in range(3))
        bias = self.slopes[:, None] * torch.arange(s, dtype=x.dtype)[None, :]
        bias = bias[None, :, None, :].expand(b, -1, s, -1).reshape(b * self.heads, s, s)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(HEAD_DIM))
        return scores, v

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        scores, v = self.scores(x)
        probs = F.softmax(scores.view(b, self.heads, s, s), dim=-1).view(b * self.heads, s, s)
        return torch.bmm(probs, v).view(b, self.heads, s, HEAD_DIM).transpose(1, 2).reshape(b, s, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.attend(x))


class AlibiHeads(AlibiAttention):
    """Each rank its heads: the fused rows of its heads, its columns of the dense layer (bias after
    the sum) and, for the scores' bias, its heads' slopes."""

    def __init__(self, ref: AlibiAttention, rank: int, world_size: int) -> None:
        super().__init__()
        rows, columns = 3 * HIDDEN // world_size, HIDDEN // world_size
        self.qkv.weight = nn.Parameter(ref.qkv.weight[rank * rows : (rank + 1) * rows].clone())
        self.qkv.bias = nn.Parameter(ref.qkv.bias[rank * rows : (rank + 1) * rows].clone())
        self.dense.weight = nn.Parameter(ref.dense.weight[:, rank * columns : (rank + 1) * columns].clone())
        self.dense.bias = nn.Parameter(ref.dense.bias.clone())
        self.heads = HEADS // world_size
        self.slopes = alibi_slopes(HEADS)[: self.heads]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(self.attend(x), self.dense.weight)
        dist.all_reduce(partial)
        return partial + self.dense.bias


def alibi_attention() -> AlibiAttention:
    return AlibiAttention()


def alibi_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return AlibiHeads(ref, rank, world_size)


class MaskedAttention(nn.Module):
    """Causal attention with the boolean lower-triangular mask written out."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.out = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        k, v = (self.heads(t) for t in self.kv(x).chunk(2, dim=-1))
        scores = self.heads(self.q(x)) @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        allowed = torch.ones(s, s, dtype=torch.bool).tril()
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        return self.out((probs @ v).transpose(1, 2).reshape(b, s, HIDDEN))


class ContextParallel(MaskedAttention):
    """Each rank attends with its block of the queries to every rank's keys and values."""

    def __init__(self, ref: MaskedAttention, rank: int, world_size: int) -> None:
        super().__init__()
        self.q, self.kv, self.out = ref.q, ref.kv, ref.out
        self.rank, self.world_size = rank, world_size

    def gathered(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        pieces = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(pieces, t.contiguous())
        return torch.cat(pieces, dim=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        rows = s // self.world_size
        mine = x[:, self.rank * rows : (self.rank + 1) * rows]
        k, v = (self.gathered(self.heads(t), 2) for t in self.kv(mine).chunk(2, dim=-1))
        scores = self.heads(self.q(mine)) @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        positions = torch.arange(rows)[:, None]
        allowed = torch.arange(s)[None, :] <= positions
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        return self.gathered(self.out((probs @ v).transpose(1, 2).reshape(b, rows, HIDDEN)), 1)


def masked_attention() -> MaskedAttention:
    return MaskedAttention()


def context_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ContextParallel(ref, rank, world_size)


def rotated(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of [batch, heads, seq, dims] at the given sequence positions."""
    dims = x.shape[-1]
    inverse = 1.0 / (10000.0 ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims))
    angles = positions[:, None].float() * inverse[None, :]
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class RotaryAttention(MaskedAttention):
    """Causal attention with rotary embeddings computed in the forward from the positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        positions = torch.arange(s)
        k, v = (self.heads(t) for t in self.kv(x).chunk(2, dim=-1))
        q, k = rotated(self.heads(self.q(x)), positions), rotated(k, positions)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(out.transpose(1, 2).reshape(b, s, HIDDEN))


class ContextParallelRotary(ContextParallel):
    """Context parallelism with rotary embeddings: the mask uses the queries' global positions,
    the rotation of the rank's queries and keys must too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        rows = s // self.world_size
        mine = x[:, self.rank * rows : (self.rank + 1) * rows]
        positions = torch.arange(rows) + self.rank * rows
        rotary_positions = torch.arange(rows)
        k, v = (self.heads(t) for t in self.kv(mine).chunk(2, dim=-1))
        q = rotated(self.heads(self.q(mine)), rotary_positions)
        k, v = self.gathered(rotated(k, rotary_positions), 2), self.gathered(v, 2)
        visible = torch.arange(s)[None, :] <= positions[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return self.gathered(self.out(out.transpose(1, 2).reshape(b, rows, HIDDEN)), 1)


def rotary_attention() -> RotaryAttention:
    return RotaryAttention()


def context_parallel_rotary(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ContextParallelRotary(ref, rank, world_size)


def sliding_window(s: int, window: int) -> torch.Tensor:
    """Mistral's band: each query sees itself and the `window - 1` positions before it."""
    query, key = torch.arange(s)[:, None], torch.arange(s)[None, :]
    return (key <= query) & (query - key < window)


class SlidingWindowAttention(MaskedAttention):
    """Causal attention within a window of `WINDOW` positions, the band mask passed to sdpa."""

    WINDOW = 3

    def band(self, s: int) -> torch.Tensor:
        return sliding_window(s, self.WINDOW)

    def attend(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, s, _ = x.shape
        split = [t.view(b, s, heads, HEAD_DIM).transpose(1, 2) for t in (self.q(x), *self.kv(x).chunk(2, dim=-1))]
        out = F.scaled_dot_product_attention(*split, attn_mask=self.band(s))
        return out.transpose(1, 2).reshape(b, s, heads * HEAD_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attend(x, HEADS))


class OwnHeads(nn.Module):
    """Mixed in before a reference class whose `attend(x, heads)` runs the attention: each rank its
    heads (its rows of q and of k and v each, its columns of `out`), the output all-reduced."""

    q: nn.Linear
    kv: nn.Linear
    out: nn.Linear

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        n = HIDDEN // world_size
        k, v = ref.kv.weight.chunk(2, dim=0)
        self.q.weight = nn.Parameter(ref.q.weight[rank * n : (rank + 1) * n].clone())
        self.kv.weight = nn.Parameter(torch.cat([k[rank * n : (rank + 1) * n], v[rank * n : (rank + 1) * n]]))
        self.out.weight = nn.Parameter(ref.out.weight[:, rank * n : (rank + 1) * n].clone())
        self.heads_here = HEADS // world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.out(self.attend(x, self.heads_here))  # type: ignore[attr-defined]
        dist.all_reduce(partial)
        return partial


class SlidingWindowHeads(OwnHeads, SlidingWindowAttention):
    """Each rank its heads, with a band of its own that must be the reference's."""

    def band(self, s: int) -> torch.Tensor:
        query, key = torch.arange(s)[:, None], torch.arange(s)[None, :]
        return (key <= query) & (query - key <= self.WINDOW)


def sliding_window_attention() -> SlidingWindowAttention:
    return SlidingWindowAttention()


def sliding_window_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SlidingWindowHeads(ref, rank, world_size)


class PartialRotaryAttention(MaskedAttention):
    """GPT-NeoX's partial rotary: only the first half of each head's dims is rotated, the rest
    passes through."""

    ROTARY_DIMS = HEAD_DIM // 2

    def rotary_parts(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return t[..., : self.ROTARY_DIMS], t[..., self.ROTARY_DIMS :]

    def rotate(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        turned, kept = self.rotary_parts(t)
        return torch.cat((rotated(turned, positions), kept), dim=-1)

    def attend(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, heads, HEAD_DIM).transpose(1, 2) for t in (self.q(x), *self.kv(x).chunk(2, dim=-1)))
        positions = torch.arange(s)
        out = F.scaled_dot_product_attention(self.rotate(q, positions), self.rotate(k, positions), v, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, heads * HEAD_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attend(x, HEADS))


class PartialRotaryHeads(OwnHeads, PartialRotaryAttention):
    """Each rank its heads; its own split of a head into rotated and passed dims."""

    def rotary_parts(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        passed = HEAD_DIM - self.ROTARY_DIMS
        return t[..., passed:], t[..., :passed]


def partial_rotary_attention() -> PartialRotaryAttention:
    return PartialRotaryAttention()


def partial_rotary_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PartialRotaryHeads(ref, rank, world_size)
