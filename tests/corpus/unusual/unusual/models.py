"""The sequential references of the corpus (tiny sizes: each check verifies in seconds)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, FFN, HEADS, HEAD_DIM, SEQ, BATCH, VOCAB = 16, 32, 4, 4, 8, 2, 30


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN)
        self.down = nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class ResidualMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class SwishResidualMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(x)))


class Attention(nn.Module):
    """Multi-head self-attention with interleaved (GPT-J style) rotary embeddings."""

    def __init__(self, rotary: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.out = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.rotary = rotary
        angles = torch.arange(SEQ)[:, None] * (10000.0 ** (-torch.arange(0, HEAD_DIM, 2) / HEAD_DIM))[None, :]
        self.register_buffer("cos", torch.cos(angles), persistent=False)
        self.register_buffer("sin", torch.sin(angles), persistent=False)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], -1, HEAD_DIM).transpose(1, 2)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., ::2], x[..., 1::2]
        return torch.stack((even * self.cos - odd * self.sin, even * self.sin + odd * self.cos), dim=-1).flatten(-2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.rotary:
            q, k = self.rotate(q), self.rotate(k)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        out = self.attend(self.heads(q), self.heads(k), self.heads(v))
        return self.out(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], HIDDEN))


class Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


class HeadBias(nn.Module):
    """Attention scores plus a per-position bias shared by every head (expanded across heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(HIDDEN, HEADS * SEQ, bias=False)
        self.bias = nn.Parameter(torch.zeros(SEQ, SEQ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.score(x).view(x.shape[0], SEQ, HEADS, SEQ).transpose(1, 2)
        return scores + self.bias.expand(HEADS, SEQ, SEQ)


class GroupedAttention(nn.Module):
    """Grouped-query attention through `F.scaled_dot_product_attention`: 4 query heads of width 8
    sharing 2 key / value heads (the default scale 1 / sqrt(8) is not a power of two)."""

    HEAD_WIDTH, KV_HEADS = 8, 2

    def __init__(self) -> None:
        super().__init__()
        width, kv = self.HEAD_WIDTH, self.KV_HEADS
        self.q_proj = nn.Linear(HIDDEN, HEADS * width, bias=False)
        self.k_proj = nn.Linear(HIDDEN, kv * width, bias=False)
        self.v_proj = nn.Linear(HIDDEN, kv * width, bias=False)
        self.o_proj = nn.Linear(HEADS * width, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        projections = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = (p(x).view(b, s, -1, self.HEAD_WIDTH).transpose(1, 2) for p in projections)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class BiasMaskAttention(nn.Module):
    """Meta's Llama attention: the causal mask an additive bias (-inf above the diagonal) on scores
    divided by sqrt(head width)."""

    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        mask = torch.triu(torch.full((s, s), float("-inf"), device=x.device), diagonal=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HEAD_DIM) + mask
        out = torch.matmul(F.softmax(scores, dim=-1), v)
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))


class Pooler(nn.Module):
    """The mean over the sequence, projected (a sentence-embedding head)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.mean(dim=1))


class NormedUp(nn.Module):
    """A projection up to FFN normalized over all FFN features by torch's `nn.RMSNorm` (OLMo-2's
    full-width query norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.norm = nn.RMSNorm(FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.up(x))


def mlp() -> MLP:
    return MLP()


def residual_mlp() -> ResidualMLP:
    return ResidualMLP()


def swish_residual_mlp() -> SwishResidualMLP:
    return SwishResidualMLP()


def attention() -> Attention:
    return Attention()


def rotary_attention() -> Attention:
    return Attention(rotary=True)


def embedding() -> Embedding:
    return Embedding()


def head_bias() -> HeadBias:
    return HeadBias()


def grouped_attention() -> GroupedAttention:
    return GroupedAttention()


def bias_mask_attention() -> BiasMaskAttention:
    return BiasMaskAttention()


def pooler() -> Pooler:
    return Pooler()


def normed_up() -> NormedUp:
    return NormedUp()


def tokens() -> tuple[torch.Tensor]:
    return (torch.randn(BATCH, SEQ, HIDDEN),)


def token_ids() -> tuple[torch.Tensor]:
    return (torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)),)
