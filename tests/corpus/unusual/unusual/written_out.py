"""Parallel programs that write out what their reference calls: attention as matmuls, a scale, a
causal mask and a softmax (against `F.scaled_dot_product_attention`), a mean and a norm as sums
all-reduced and divided by the full size (against `mean` and `nn.RMSNorm`), swish as
`h / (1 + exp(-h))` (against `F.silu`); and the other way
round, attention through `F.scaled_dot_product_attention` against a reference that writes it
out with an additive mask. Our own code."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import FFN, HEAD_DIM, HEADS, HIDDEN, GroupedAttention


def _block(weight: torch.Tensor, dim: int, start: int, length: int) -> nn.Parameter:
    return nn.Parameter(weight.narrow(dim, start, length).clone())


class EinsumGroupedAttention(nn.Module):
    """Heads split over ranks; each rank holds the key / value heads its query heads read (one
    head shared by several ranks when there are more ranks than key heads), repeats them up to
    its query heads, and writes attention with einsum, `head_dim ** -0.5` and `triu`."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        width, kv_heads = GroupedAttention.HEAD_WIDTH, GroupedAttention.KV_HEADS
        self.local_heads = HEADS // world_size
        group = HEADS // kv_heads
        first_kv = rank * self.local_heads // group
        self.local_kv = max(1, kv_heads // world_size)
        self.head_dim = width
        self.q = _block(ref.q_proj.weight, 0, rank * self.local_heads * width, self.local_heads * width)
        self.k = _block(ref.k_proj.weight, 0, first_kv * width, self.local_kv * width)
        self.v = _block(ref.v_proj.weight, 0, first_kv * width, self.local_kv * width)
        self.o = _block(ref.o_proj.weight, 1, rank * self.local_heads * width, self.local_heads * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, self.head_dim) for w in (self.q, self.k, self.v))
        k = k.repeat_interleave(self.local_heads // self.local_kv, dim=2)
        v = v.repeat_interleave(self.local_heads // self.local_kv, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.head_dim**-0.5
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, -1)
        out = F.linear(out, self.o)
        dist.all_reduce(out)
        return out


def einsum_grouped_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return EinsumGroupedAttention(ref, rank, world_size)


class MatmulHeads(nn.Module):
    """Megatron's fused QKV split by heads (each rank its block of each part), attention written
    as nanoGPT writes it: `q @ k.transpose(-2, -1) / sqrt(head_dim)`, the future masked where
    `tril(ones) == 0`, softmax, `@ v`."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        per = HIDDEN // world_size
        parts = ref.qkv.weight.chunk(3)
        self.qkv = nn.Parameter(torch.cat([part[rank * per : (rank + 1) * per] for part in parts]).clone())
        self.out = _block(ref.out.weight, 1, rank * per, per)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM).transpose(1, 2) for t in F.linear(x, self.qkv).chunk(3, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM)
        future = torch.tril(torch.ones(s, s, device=x.device)) == 0
        out = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        out = F.linear(out.transpose(1, 2).reshape(b, s, -1), self.out)
        dist.all_reduce(out)
        return out


def matmul_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MatmulHeads(ref, rank, world_size)


class SdpaHeads(nn.Module):
    """Heads split over ranks (a block of rows of each projection), attention through
    `F.scaled_dot_product_attention(is_causal=True)` where the reference adds a -inf mask."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        per = HIDDEN // world_size
        self.q, self.k, self.v = (_block(w.weight, 0, rank * per, per) for w in (ref.wq, ref.wk, ref.wv))
        self.o = _block(ref.wo.weight, 1, rank * per, per)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM).transpose(1, 2) for w in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = F.linear(out.transpose(1, 2).reshape(b, s, -1), self.o)
        dist.all_reduce(out)
        return out


def sdpa_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SdpaHeads(ref, rank, world_size)


class ScaledOperandHeads(nn.Module):
    """Heads split over ranks (a block of rows of each part of the fused QKV weight), the attention
    scale applied where other code bases put it: on the queries before the scores (BART, many
    decoders: `q = q * scale`), on the transposed keys (`q @ (k^T / sqrt(d))`), or half of it on
    each (Whisper: queries and keys times `d ** -0.25`)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, where: str) -> None:
        super().__init__()
        per = HIDDEN // world_size
        parts = ref.qkv.weight.chunk(3)
        self.qkv = nn.Parameter(torch.cat([part[rank * per : (rank + 1) * per] for part in parts]).clone())
        self.out = _block(ref.out.weight, 1, rank * per, per)
        self.where = where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM).transpose(1, 2) for t in F.linear(x, self.qkv).chunk(3, dim=-1))
        if self.where == "queries":
            scores = (q * HEAD_DIM**-0.5) @ k.transpose(-2, -1)
        elif self.where == "keys":
            scores = q @ (k.transpose(-2, -1) / math.sqrt(HEAD_DIM))
        else:
            half = HEAD_DIM**-0.25
            scores = (q * half) @ (k * half).transpose(-2, -1)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        out = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        out = F.linear(out.transpose(1, 2).reshape(b, s, -1), self.out)
        dist.all_reduce(out)
        return out


def queries_scaled_first(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScaledOperandHeads(ref, rank, world_size, "queries")


def keys_scaled_first(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScaledOperandHeads(ref, rank, world_size, "keys")


def both_scaled_by_a_root(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScaledOperandHeads(ref, rank, world_size, "both")


class MaskedSdpaHeads(nn.Module):
    """Heads split over ranks, attention through `F.scaled_dot_product_attention` with an explicit
    mask where the reference passes `is_causal=True` (transformers' models build their own mask):
    a boolean one (True where a key is kept) or an additive one (0 or -inf). `keep` says which
    keys a query keeps: the causal ones, or (the mistakes the tests show) the strictly earlier
    ones or the later ones."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, mask: str, keep: str = "causal") -> None:
        super().__init__()
        per = HIDDEN // world_size
        parts = ref.qkv.weight.chunk(3)
        self.qkv = nn.Parameter(torch.cat([part[rank * per : (rank + 1) * per] for part in parts]).clone())
        self.out = _block(ref.out.weight, 1, rank * per, per)
        self.mask, self.keep = mask, keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM).transpose(1, 2) for t in F.linear(x, self.qkv).chunk(3, dim=-1))
        if self.keep == "causal":
            kept = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        elif self.keep == "earlier":
            kept = torch.ones(s, s, dtype=torch.bool, device=x.device).tril(diagonal=-1)
        else:
            kept = torch.ones(s, s, dtype=torch.bool, device=x.device).triu()
        if self.mask == "additive":
            mask = torch.zeros(s, s, device=x.device).masked_fill(kept.logical_not(), float("-inf"))
        else:
            mask = kept
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = F.linear(out.transpose(1, 2).reshape(b, s, -1), self.out)
        dist.all_reduce(out)
        return out


def sdpa_boolean_mask(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MaskedSdpaHeads(ref, rank, world_size, "boolean")


def sdpa_additive_mask(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MaskedSdpaHeads(ref, rank, world_size, "additive")


class SequenceShardedMean(nn.Module):
    """Each rank sums its block of positions; the sums all-reduced are divided by the whole
    sequence's length (the input's, which every rank holds)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.proj_w = nn.Parameter(ref.proj.weight.clone())
        self.proj_b = nn.Parameter(ref.proj.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        block = x.shape[1] // self.world_size
        total = x.narrow(1, self.rank * block, block).sum(dim=1)
        dist.all_reduce(total)
        return F.linear(total / x.shape[1], self.proj_w, self.proj_b)


def sequence_sharded_mean(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceShardedMean(ref, rank, world_size)


class WidthShardedRMSNorm(nn.Module):
    """A column-parallel projection normalized over its whole width: each rank's sum of squares
    all-reduced and divided by the full width, each rank scaling its block, the blocks gathered."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        block = FFN // world_size
        self.up = _block(ref.up.weight, 0, rank * block, block)
        self.norm_w = _block(ref.norm.weight, 0, rank * block, block)
        self.world_size = world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.up)
        squares = h.pow(2).sum(-1, keepdim=True)
        dist.all_reduce(squares)
        local = h * torch.rsqrt(squares / FFN + torch.finfo(h.dtype).eps) * self.norm_w
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)


def width_sharded_rms_norm(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return WidthShardedRMSNorm(ref, rank, world_size)


class QuotientSwishMLP(nn.Module):
    """A column- and row-parallel MLP whose activation is written as `h / (1 + exp(-h))` (the
    swish of ports that spell out the logistic function) and whose residual comes last, after the
    bias: `(out + bias) + x` where the reference adds `x + (out + bias)`."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        n = FFN // world_size
        self.up_w = _block(ref.up.weight, 0, rank * n, n)
        self.up_b = _block(ref.up.bias, 0, rank * n, n)
        self.down_w = _block(ref.down.weight, 1, rank * n, n)
        self.down_b = ref.down.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.up_w, self.up_b)
        out = F.linear(h / (1 + torch.exp(-h)), self.down_w)
        dist.all_reduce(out)
        return out + self.down_b + x


def quotient_swish_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return QuotientSwishMLP(ref, rank, world_size)
