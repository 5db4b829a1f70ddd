"""Sequential reference: a Llama-style decoder.

Token embedding, RMSNorm, attention with rotary position embeddings and grouped-query
key/value heads (one packed QKV projection), a SwiGLU feed-forward block and an LM head.
The attention and feed-forward output projections carry a bias so that the row-parallel
bias path of the tensor-parallel version is exercised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 512
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 256
    max_seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


QUICK_CONFIG = LlamaConfig(n_layers=1, dim=64, ffn_dim=128, vocab_size=256, max_seq_len=32)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of layout [batch, seq, heads, head_dim] by the tables [seq, head_dim]."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return x * cos + rotate_half(x) * sin


def rotate_heads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """Apply rotary embeddings to heads [start, start + count) of a packed [b, s, heads, d] tensor."""
    pieces = [x[:, :, :start], apply_rotary(x[:, :, start : start + count], cos, sin), x[:, :, start + count :]]
    return torch.cat([piece for piece in pieces if piece.shape[2] > 0], dim=2)


def repeat_kv(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """Repeat each key/value head `repeats` times: [b, s, kv, d] -> [b, s, kv * repeats, d]."""
    b, s, kv, d = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, repeats, d).reshape(b, s, kv * repeats, d)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over [b, s, heads, d] tensors; returns [b, s, heads * d]."""
    b, s = q.shape[:2]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2).reshape(b, s, -1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.wqkv(x).view(b, s, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        qkv = rotate_heads(qkv, cos, sin, start=0, count=self.n_heads + self.n_kv_heads)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=2)
        repeats = self.n_heads // self.n_kv_heads
        out = attend(q, repeat_kv(k, repeats), repeat_kv(v, repeats))
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


class LlamaWithLoss(Llama):
    """The training forward: the mean next-token cross entropy, with label smoothing."""

    def __init__(self, cfg: LlamaConfig, label_smoothing: float = 0.1) -> None:
        super().__init__(cfg)
        self.label_smoothing = label_smoothing

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = super().forward(tokens)
        flat = logits.view(-1, logits.shape[-1])
        return F.cross_entropy(flat, targets.view(-1), label_smoothing=self.label_smoothing)


def build(cfg: LlamaConfig | None = None) -> Llama:
    return Llama(cfg or LlamaConfig())


def build_quick() -> Llama:
    return Llama(QUICK_CONFIG)


def build_with_loss(cfg: LlamaConfig | None = None) -> LlamaWithLoss:
    return LlamaWithLoss(cfg or LlamaConfig())


def build_with_loss_quick() -> LlamaWithLoss:
    return LlamaWithLoss(QUICK_CONFIG)


def example_inputs_with_targets(cfg: LlamaConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and the next token at every position (class indices in [0, vocab_size))."""
    cfg = cfg or LlamaConfig()
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(0, cfg.vocab_size, (2, 17), generator=generator)
    return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()


def example_inputs_with_targets_quick() -> tuple[torch.Tensor, torch.Tensor]:
    return example_inputs_with_targets(QUICK_CONFIG)


def example_inputs(cfg: LlamaConfig | None = None) -> tuple[torch.Tensor]:
    cfg = cfg or LlamaConfig()
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, cfg.vocab_size, (2, 16), generator=generator),)


def example_inputs_quick() -> tuple[torch.Tensor]:
    return example_inputs(QUICK_CONFIG)
