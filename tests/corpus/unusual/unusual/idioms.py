"""References and their parallel versions in idioms of other public code bases (our own small
equivalents; nothing is copied): Meta's Llama complex rotary embedding, Bloom's ALiBi scores
through `baddbmm`, functional collectives (gpt-fast, torchtitan), `addmm` with a pre-scaled bias,
an in-place bias after the all-reduce, Megatron's gather along the last dimension through the
first, a two-pass layer norm over a hidden-sharded activation, T5's relative position bias
sharded by heads and `scaled_dot_product_attention(enable_gqa=True)` with a fused key / value
weight narrowed by heads."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import FFN, HEAD_DIM, HEADS, HIDDEN, SEQ


def _block(weight: torch.Tensor, dim: int, rank: int, world_size: int) -> nn.Parameter:
    size = weight.shape[dim] // world_size
    return nn.Parameter(weight.narrow(dim, rank * size, size).clone())


# -- Meta's Llama: rotary embeddings as complex products --------------------------------------------
def _rotary_table(head_dim: int, length: int) -> torch.Tensor:
    dtype = torch.get_default_dtype()  # (Meta's code uses float32; the ground truth runs in float64)
    inverse = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=dtype)[: head_dim // 2] / head_dim))
    angles = torch.outer(torch.arange(length, dtype=dtype), inverse)
    return torch.polar(torch.ones_like(angles), angles)


def _rotated(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    turned = pairs * table.view(1, pairs.shape[1], 1, pairs.shape[-1])
    return torch.view_as_real(turned).flatten(3).type_as(x)


class ComplexRotaryAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))
        self.heads = HEADS
        self.table = _rotary_table(HEAD_DIM, SEQ)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, HEAD_DIM)
        k = self.wk(x).view(b, s, self.heads, HEAD_DIM)
        v = self.wv(x).view(b, s, self.heads, HEAD_DIM)
        q, k = _rotated(q, self.table), _rotated(k, self.table)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HEAD_DIM)
        out = torch.matmul(F.softmax(scores, dim=-1).type_as(q), v)
        return self.wo(out.transpose(1, 2).contiguous().view(x.shape[0], x.shape[1], -1))


class ComplexRotaryHeads(ComplexRotaryAttention):
    """fairscale's ColumnParallelLinear for wq, wk, wv and RowParallelLinear for wo, as Meta's
    Llama uses them: each rank its heads."""

    def __init__(self, ref: ComplexRotaryAttention, rank: int, world_size: int) -> None:
        super().__init__()
        for name in ("wq", "wk", "wv"):
            getattr(self, name).weight = _block(getattr(ref, name).weight, 0, rank, world_size)
        self.wo.weight = _block(ref.wo.weight, 1, rank, world_size)
        self.heads = HEADS // world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


def complex_rotary_attention() -> ComplexRotaryAttention:
    return ComplexRotaryAttention()


def complex_rotary_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ComplexRotaryHeads(ref, rank, world_size)


# -- Bloom: ALiBi scores through baddbmm ---------------------------------------------------------
def _alibi_slopes(heads: int) -> torch.Tensor:
    base = 2.0 ** (-(2.0 ** -(math.log2(heads) - 3)))
    return base ** torch.arange(1, heads + 1).float()


class AlibiAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=True)
        self.dense = nn.Linear(HIDDEN, HIDDEN, bias=True)
        self.heads = HEADS
        self.slopes = _alibi_slopes(HEADS)

    def alibi(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], dtype=x.dtype)
        bias = self.slopes.to(x.dtype)[:, None] * positions[None, :]  # (heads, keys)
        return bias[None, :, None, :].expand(x.shape[0], -1, x.shape[1], -1).reshape(-1, x.shape[1], x.shape[1])

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        fused = self.qkv(x).view(b, s, self.heads, 3, HEAD_DIM)
        q, k, v = (fused[..., i, :].transpose(1, 2).reshape(b * self.heads, s, HEAD_DIM) for i in range(3))
        scores = torch.baddbmm(self.alibi(x), q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(HEAD_DIM))
        probs = F.softmax(scores.view(b, self.heads, s, s), dim=-1).view(b * self.heads, s, s)
        out = torch.bmm(probs, v).view(b, self.heads, s, HEAD_DIM).transpose(1, 2).reshape(b, s, -1)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.attend(x))


class AlibiHeads(AlibiAttention):
    """Megatron-DeepSpeed's Bloom: the fused QKV rows of the rank's heads (interleaved per head),
    the rank's slice of the ALiBi slopes, the dense layer's columns, its bias after the sum."""

    def __init__(self, ref: AlibiAttention, rank: int, world_size: int) -> None:
        super().__init__()
        self.qkv.weight = _block(ref.qkv.weight, 0, rank, world_size)
        self.qkv.bias = _block(ref.qkv.bias, 0, rank, world_size)
        self.dense.weight = _block(ref.dense.weight, 1, rank, world_size)
        self.dense.bias = nn.Parameter(ref.dense.bias.clone())
        self.heads = HEADS // world_size
        self.slopes = _alibi_slopes(HEADS)[rank * self.heads : (rank + 1) * self.heads]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(self.attend(x), self.dense.weight)
        dist.all_reduce(partial)
        return partial + self.dense.bias


def alibi_attention() -> AlibiAttention:
    return AlibiAttention()


def alibi_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return AlibiHeads(ref, rank, world_size)


# -- MLP idioms: functional collectives, addmm, an in-place bias, a gather through dim 0 --------
class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN)
        self.down = nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


class ShardedTwoLayer(nn.Module):
    def __init__(self, ref: TwoLayer, rank: int, world_size: int, how: str) -> None:
        super().__init__()
        self.up_w = _block(ref.up.weight, 0, rank, world_size)
        self.up_b = _block(ref.up.bias, 0, rank, world_size)
        self.down_w = _block(ref.down.weight, 1, rank, world_size)
        self.down_b = nn.Parameter(ref.down.bias.clone())
        self.world_size, self.how = world_size, how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(F.linear(x, self.up_w, self.up_b))
        if self.how == "funcol":  # gpt-fast / torchtitan: functional collectives return a new tensor
            from torch.distributed import _functional_collectives as funcol

            return funcol.all_reduce(F.linear(hidden, self.down_w), "sum", list(range(self.world_size))) + self.down_b
        if self.how == "autograd functional":  # torch.distributed.nn: differentiable collectives
            from torch.distributed.nn.functional import all_reduce

            return all_reduce(F.linear(hidden, self.down_w)) + self.down_b
        if self.how == "addmm":  # DeepSpeed-style: bias / world_size folded into every rank's addmm
            flat = hidden.reshape(-1, hidden.shape[-1])
            out = torch.addmm(self.down_b / self.world_size, flat, self.down_w.t()).view(*x.shape[:-1], -1)
            dist.all_reduce(out)
            return out
        out = torch.matmul(hidden, self.down_w.t())  # in place after the sum
        dist.all_reduce(out)
        out.add_(self.down_b)
        return out


class GatheredColumns(nn.Module):
    """Megatron's column-parallel linear with `gather_output`: `all_gather_into_tensor` stacks the
    ranks' outputs along dim 0, and the chunks are concatenated along the last dim."""

    def __init__(self, ref: TwoLayer, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = _block(ref.up.weight, 0, rank, world_size)
        self.up_b = _block(ref.up.bias, 0, rank, world_size)
        self.down = ref.down
        self.world_size = world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.up_w, self.up_b).contiguous()
        stacked = local.new_empty((self.world_size * local.shape[0], *local.shape[1:]))
        dist.all_gather_into_tensor(stacked, local)
        full = torch.cat(stacked.chunk(self.world_size, dim=0), dim=-1).contiguous()
        return self.down(F.silu(full))


def two_layer() -> TwoLayer:
    return TwoLayer()


def funcol_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedTwoLayer(ref, rank, world_size, "funcol")


def autograd_functional_reduce(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedTwoLayer(ref, rank, world_size, "autograd functional")


def addmm_prescaled_bias(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedTwoLayer(ref, rank, world_size, "addmm")


def inplace_bias_after_sum(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ShardedTwoLayer(ref, rank, world_size, "in place")


def gathered_columns(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return GatheredColumns(ref, rank, world_size)


# -- a layer norm over a hidden-sharded activation, in two passes -------------------------------
class UpNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.norm = nn.LayerNorm(FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.up(x))


class UpNormSharded(nn.Module):
    """The features split over ranks: the mean, then the variance of the centred values, each
    from an all-reduced sum; every rank normalizes its own features."""

    def __init__(self, ref: UpNorm, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = _block(ref.up.weight, 0, rank, world_size)
        self.gain = _block(ref.norm.weight, 0, rank, world_size)
        self.shift = _block(ref.norm.bias, 0, rank, world_size)
        self.eps = ref.norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.up_w)
        total = h.sum(dim=-1, keepdim=True)
        dist.all_reduce(total)
        centred = h - total / FFN
        squares = (centred * centred).sum(dim=-1, keepdim=True)
        dist.all_reduce(squares)
        return centred * torch.rsqrt(squares / FFN + self.eps) * self.gain + self.shift


def up_norm() -> UpNorm:
    return UpNorm()


def up_norm_sharded(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return UpNormSharded(ref, rank, world_size)


# -- T5: a relative position bias table, sharded by heads ---------------------------------------
class RelativeBiasScores(nn.Module):
    BUCKETS = 6

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.table = nn.Embedding(self.BUCKETS, HEADS)
        self.heads = HEADS

    def buckets(self, s: int) -> torch.Tensor:
        distance = torch.arange(s)[None, :] - torch.arange(s)[:, None]
        return distance.abs().clamp(max=self.BUCKETS - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, HEAD_DIM).transpose(1, 2)
        bias = self.table(self.buckets(s)).permute(2, 0, 1).unsqueeze(0)
        probs = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
        mixed = (probs @ k).transpose(1, 2).reshape(b, s, -1)
        return self.o(mixed)


class RelativeBiasHeads(RelativeBiasScores):
    def __init__(self, ref: RelativeBiasScores, rank: int, world_size: int) -> None:
        super().__init__()
        self.q.weight = _block(ref.q.weight, 0, rank, world_size)
        self.k.weight = _block(ref.k.weight, 0, rank, world_size)
        self.o.weight = _block(ref.o.weight, 1, rank, world_size)
        self.table.weight = _block(ref.table.weight, 1, rank, world_size)
        self.heads = HEADS // world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


def relative_bias_scores() -> RelativeBiasScores:
    return RelativeBiasScores()


def relative_bias_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RelativeBiasHeads(ref, rank, world_size)


# -- grouped-query attention through sdpa's own grouping, keys and values fused -------------------
class GqaSdpa(nn.Module):
    KV_HEADS = 2

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * self.KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.heads, self.kv_heads = HEADS, self.KV_HEADS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, HEAD_DIM).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, HEAD_DIM).unbind(2)
        out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class GqaSdpaHeads(GqaSdpa):
    """Each rank its query heads and their key / value heads: the fused weight viewed as (keys and
    values, heads, head_dim, hidden) and narrowed to the rank's heads (2 ranks: one kv head each)."""

    def __init__(self, ref: GqaSdpa, rank: int, world_size: int) -> None:
        super().__init__()
        self.q.weight = _block(ref.q.weight, 0, rank, world_size)
        kv = ref.kv.weight.view(2, self.KV_HEADS, HEAD_DIM, HIDDEN)
        self.kv.weight = nn.Parameter(_block(kv, 1, rank, world_size).reshape(-1, HIDDEN))
        self.o.weight = _block(ref.o.weight, 1, rank, world_size)
        self.heads, self.kv_heads = HEADS // world_size, self.KV_HEADS // world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


def gqa_sdpa() -> GqaSdpa:
    return GqaSdpa()


def gqa_sdpa_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return GqaSdpaHeads(ref, rank, world_size)


# -- GPT-2's Conv1D (weight stored (in, out), addmm), Megatron-style column / row split ----------
class Conv1D(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(*x.shape[:-1], -1)


class Gpt2Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(HIDDEN, FFN), Conv1D(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Gpt2MlpColumnsRows(nn.Module):
    """Each rank the columns of c_fc (its weight's second dim) and the rows of c_proj, kept flat
    (tokens x features) through the activation, viewed back to 3 dims only at the end."""

    def __init__(self, ref: Gpt2Mlp, rank: int, world_size: int) -> None:
        super().__init__()
        self.fc_w = _block(ref.c_fc.weight, 1, rank, world_size)
        self.fc_b = _block(ref.c_fc.bias, 0, rank, world_size)
        self.proj_w = _block(ref.c_proj.weight, 0, rank, world_size)
        self.proj_b = nn.Parameter(ref.c_proj.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(torch.addmm(self.fc_b, x.view(-1, HIDDEN), self.fc_w), approximate="tanh")
        out = torch.mm(h, self.proj_w)
        dist.all_reduce(out)
        return (out + self.proj_b).view(*x.shape[:-1], -1)


def gpt2_mlp() -> Gpt2Mlp:
    return Gpt2Mlp()


def gpt2_mlp_columns_rows(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return Gpt2MlpColumnsRows(ref, rank, world_size)


# -- Mixtral-style experts: top-k routing, flat tokens, experts split over ranks -------------------
class TopKExperts(nn.Module):
    EXPERTS, TOP = 4, 2

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(HIDDEN, self.EXPERTS, bias=False)
        self.w_in = nn.Parameter(torch.randn(self.EXPERTS, FFN, HIDDEN) * 0.1)
        self.w_out = nn.Parameter(torch.randn(self.EXPERTS, HIDDEN, FFN) * 0.1)
        self.experts = range(self.EXPERTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(-1, HIDDEN)
        weights, chosen = torch.topk(F.softmax(self.router(flat), dim=-1), self.TOP, dim=-1)
        out = torch.zeros_like(flat)
        for e in self.experts:
            gate = (weights * (chosen == e).to(flat.dtype)).sum(dim=-1, keepdim=True)
            out = out + gate * F.linear(F.silu(F.linear(flat, self.w_in[e])), self.w_out[e])
        return out.view_as(x)


class TopKExpertsPerRank(TopKExperts):
    """Each rank its block of experts (the router and the weights in full), the sum of its experts'
    outputs viewed back to the activation's shape, then one all-reduce."""

    def __init__(self, ref: TopKExperts, rank: int, world_size: int) -> None:
        super().__init__()
        self.router.weight = nn.Parameter(ref.router.weight.clone())
        self.w_in, self.w_out = nn.Parameter(ref.w_in.clone()), nn.Parameter(ref.w_out.clone())
        count = self.EXPERTS // world_size
        self.experts = range(rank * count, (rank + 1) * count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out)
        return out


def top_k_experts() -> TopKExperts:
    return TopKExperts()


def top_k_experts_per_rank(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return TopKExpertsPerRank(ref, rank, world_size)


class ClampedVocabShard(nn.Module):
    """A vocabulary-parallel embedding (30 ids over the ranks, ceil-divided) whose local ids are
    clamped into the rank's rows instead of masked; the rows of ids outside the shard zeroed by a
    product with the inside mask, then all-reduced."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        vocab = ref.table.weight.shape[0]
        block = -(-vocab // world_size)
        self.start, self.end = rank * block, min((rank + 1) * block, vocab)
        self.rows = nn.Parameter(ref.table.weight[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        inside = (ids >= self.start) & (ids < self.end)
        local = (ids - self.start).clamp(0, self.end - self.start - 1)
        rows = F.embedding(local, self.rows) * inside.unsqueeze(-1).to(self.rows.dtype)
        dist.all_reduce(rows)
        return rows


def clamped_vocab_shard(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ClampedVocabShard(ref, rank, world_size)
