"""Constants computed from a rank's local sizes where the global ones belong (family `constant`)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .comm import all_reduce_sum, gather_last_dim
from .models import FFN, HEAD_DIM, HEADS, HIDDEN, SEQ  # noqa: F401 (SEQ: the pooler's fix)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """[b, s, h, d] -> [b, s, h * d]: explicit causal attention scaled by `scale`."""
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    scores = torch.einsum("bshd,bthd->bhst", q, k) * scale
    causal = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool, device=q.device).triu(1)
    probs = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
    return torch.einsum("bhst,bthd->bshd", probs, v).flatten(2)


class ScaledGQA(nn.Module):
    """GQA with q / k / v column-parallel by heads, the scores scaled explicitly."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.q_size = HEADS * HEAD_DIM // world_size
        self.q = nn.Parameter(ref.q_proj.weight.chunk(world_size, dim=0)[rank].clone())
        self.k = nn.Parameter(ref.k_proj.weight.chunk(world_size, dim=0)[rank].clone())
        self.v = nn.Parameter(ref.v_proj.weight.chunk(world_size, dim=0)[rank].clone())
        self.o = nn.Parameter(ref.o_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.scale = 1.0 / math.sqrt(self.q_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM) for w in (self.q, self.k, self.v))
        return all_reduce_sum(F.linear(_attention(q, k, v, self.scale), self.o))


def scale_from_local_width(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScaledGQA(ref, rank, world_size)


class PrescaledQueries(ScaledGQA):
    """The queries scaled before torch's attention (`scale=1.0`), as some code bases fold the
    softmax scale into the query projection's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM).transpose(1, 2) for w in (self.q, self.k, self.v))
        q = q * self.q_size**-0.5
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
        return all_reduce_sum(F.linear(out.transpose(1, 2).flatten(2), self.o))


def prescaled_queries_local_width(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PrescaledQueries(ref, rank, world_size)


class PrescaledQueriesKept(PrescaledQueries):
    """As PrescaledQueries, the factor kept by the builder (a `scaling` attribute, as Hugging Face
    attention classes keep it)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.scaling = self.q_size**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (F.linear(x, w).view(b, s, -1, HEAD_DIM).transpose(1, 2) for w in (self.q, self.k, self.v))
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q * self.scaling, k, v, is_causal=True, scale=1.0)
        return all_reduce_sum(F.linear(out.transpose(1, 2).flatten(2), self.o))


def prescaled_queries_kept_local_width(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PrescaledQueriesKept(ref, rank, world_size)


class ScaledMHA(nn.Module):
    """GPT-2 attention with the heads split over ranks; the head dim (for the scale) derived from
    the hidden width and the head count."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.num_heads = HEADS // world_size  # heads on this rank
        parts = ref.c_attn.weight.chunk(3), ref.c_attn.bias.chunk(3)
        self.qkv_w = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in parts[0]]).clone())
        self.qkv_b = nn.Parameter(torch.cat([p.chunk(world_size)[rank] for p in parts[1]]).clone())
        self.proj_w = nn.Parameter(ref.c_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.proj_b = nn.Parameter(ref.c_proj.bias.clone())
        head_dim = HIDDEN // self.num_heads
        self.scale = head_dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in F.linear(x, self.qkv_w, self.qkv_b).chunk(3, dim=-1))
        return all_reduce_sum(F.linear(_attention(q, k, v, self.scale), self.proj_w)) + self.proj_b


def scale_from_local_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScaledMHA(ref, rank, world_size)


class ModelCountHeads(ScaledMHA):
    """The same attention with its scale right, splitting each projection into heads by a helper
    given the model's head count (gpt-fast's `view(b, s, n_head, head_dim)` with `n_head` the
    configuration's, where the rank holds `n_local_heads`)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.n_head = HEADS
        self.scale = HEAD_DIM**-0.5

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.n_head, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(t) for t in F.linear(x, self.qkv_w, self.qkv_b).chunk(3, dim=-1))
        return all_reduce_sum(F.linear(_attention(q, k, v, self.scale), self.proj_w)) + self.proj_b


def heads_viewed_with_model_count(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ModelCountHeads(ref, rank, world_size)


class ShardedWidthRMSNorm(nn.Module):
    """A column-parallel projection normalized over its full (sharded) width: the sum of squares
    all-reduced, divided by the width, each rank scaling its block; the blocks gathered."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.norm_w = nn.Parameter(ref.norm.weight.chunk(world_size, dim=0)[rank].clone())
        self.local_width = FFN // world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.up)
        sum_sq = all_reduce_sum(h.pow(2).sum(-1, keepdim=True))
        mean_sq = sum_sq / self.local_width
        return gather_last_dim(self.norm_w * h * torch.rsqrt(mean_sq + 1e-6))


def norm_divisor_local_width(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedWidthRMSNorm(ref, rank, world_size)


class AveragedRowParallelMLP(nn.Module):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        return all_reduce_sum(out) / self.world_size + self.down_b


def extra_world_size_scale(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return AveragedRowParallelMLP(ref, rank, world_size)


class SequenceShardedPooler(nn.Module):
    """Each rank sums its block of the sequence; the sums all-reduced and divided by the length."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.proj = ref.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_local = x.chunk(self.world_size, dim=1)[self.rank]
        total = all_reduce_sum(x_local.sum(dim=1))
        pooled = total / x_local.shape[1]
        return self.proj(pooled)


def mean_over_local_length(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceShardedPooler(ref, rank, world_size)


class ScaledHiddenShardedEmbedding(nn.Module):
    """fairscale ParallelEmbedding (the table split along the hidden dim) with Gemma's scaling."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.embed_tokens.weight.chunk(world_size, dim=1)[rank].clone())
        self.normalizer = self.weight.shape[1] ** 0.5

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = F.embedding(ids, self.weight) * self.normalizer
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)


def embedding_scale_local_width(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScaledHiddenShardedEmbedding(ref, rank, world_size)
