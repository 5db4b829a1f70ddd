"""A Llama-style decoder written once, on fairscale's model-parallel layers.

This is how fairscale users (Meta's own Llama code among them) write tensor parallelism: one
model whose layers read the model-parallel rank and size from fairscale, run at world size N,
with the same code at world size 1 as the reference. Attention projections are
ColumnParallelLinear (query, key, value) and RowParallelLinear (output); the feed-forward block
applies its sharded weights with F.linear and reduces once, explicitly, as fused or MoE code
does; tokens go through a VocabParallelEmbedding (Llama 3) or a ParallelEmbedding (Llama 2),
and the LM head is a ColumnParallelLinear whose shards are gathered at the end. For training,
`TransformerWithLoss` keeps the logits sharded over the vocabulary and takes fairscale's
vocab-parallel cross entropy of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import fairscale.nn.model_parallel.initialize as fs_init
import torch
import torch.distributed as dist
import torch.nn.functional as F
from fairscale.nn.model_parallel.cross_entropy import vocab_parallel_cross_entropy
from fairscale.nn.model_parallel.layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from fairscale.nn.model_parallel.mappings import (
    copy_to_model_parallel_region,
    gather_from_model_parallel_region,
    reduce_from_model_parallel_region,
)
from torch import nn


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int = 256
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_dim: int = 256
    max_seq_len: int = 32
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    vocab_parallel_embedding: bool = True  # False: Llama 2's ParallelEmbedding (sharded along the model dim)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


QUICK = ModelArgs(n_layers=1, dim=64, ffn_dim=128, vocab_size=128)


def keep(weight: torch.Tensor) -> torch.Tensor:
    """Weights come from a checkpoint: no random initialisation."""
    return weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inverse = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(length).float(), inverse)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on interleaved pairs of a [batch, seq, heads, head_dim] tensor."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        world_size = fs_init.get_model_parallel_world_size()
        self.n_local_heads = args.n_heads // world_size
        self.n_local_kv_heads = args.n_kv_heads // world_size
        self.head_dim = args.head_dim
        self.wq = ColumnParallelLinear(
            args.dim, args.n_heads * args.head_dim, bias=False, gather_output=False, init_method=keep
        )
        self.wk = ColumnParallelLinear(
            args.dim, args.n_kv_heads * args.head_dim, bias=False, gather_output=False, init_method=keep
        )
        self.wv = ColumnParallelLinear(
            args.dim, args.n_kv_heads * args.head_dim, bias=False, gather_output=False, init_method=keep
        )
        self.wo = RowParallelLinear(
            args.n_heads * args.head_dim, args.dim, bias=False, input_is_parallel=True, init_method=keep
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_local_heads, self.head_dim)
        k = self.wk(x).view(batch, seq, self.n_local_kv_heads, self.head_dim)
        v = self.wv(x).view(batch, seq, self.n_local_kv_heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeats = self.n_local_heads // self.n_local_kv_heads
        k = k.repeat_interleave(repeats, dim=2)
        v = v.repeat_interleave(repeats, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU whose sharded weights are applied with F.linear and reduced once, explicitly."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = ColumnParallelLinear(args.dim, args.ffn_dim, bias=False, gather_output=False, init_method=keep)
        self.w3 = ColumnParallelLinear(args.dim, args.ffn_dim, bias=False, gather_output=False, init_method=keep)
        self.w2 = RowParallelLinear(args.ffn_dim, args.dim, bias=False, input_is_parallel=True, init_method=keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_model_parallel_region(x)
        hidden = F.silu(F.linear(x, self.w1.weight)) * F.linear(x, self.w3.weight)
        return reduce_from_model_parallel_region(F.linear(hidden, self.w2.weight))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        if args.vocab_parallel_embedding:
            self.tok_embeddings = VocabParallelEmbedding(args.vocab_size, args.dim, init_method=keep)
        else:
            self.tok_embeddings = ParallelEmbedding(args.vocab_size, args.dim, init_method=keep)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = ColumnParallelLinear(args.dim, args.vocab_size, bias=False, gather_output=False, init_method=keep)
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return gather_from_model_parallel_region(self.output(self.norm(self.hidden_states(tokens))))

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return h


class TransformerWithLoss(Transformer):
    """The training forward: the mean next-token loss, from logits sharded over the vocabulary."""

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = self.output(self.norm(self.hidden_states(tokens)))  # sharded over the vocabulary
        return vocab_parallel_cross_entropy(logits, targets).mean()


def _initialise_model_parallel() -> None:
    """What a fairscale training script does first: every rank of the job is one model-parallel group."""
    if not fs_init.model_parallel_is_initialized():
        fs_init.initialize_model_parallel(dist.get_world_size())


def build(args: ModelArgs | None = None) -> Transformer:
    _initialise_model_parallel()
    return Transformer(args or ModelArgs())


def build_quick() -> Transformer:
    return build(QUICK)


def build_llama2() -> Transformer:
    return build(ModelArgs(vocab_parallel_embedding=False))


def build_llama2_quick() -> Transformer:
    return build(ModelArgs(n_layers=1, dim=64, ffn_dim=128, vocab_size=128, vocab_parallel_embedding=False))


def build_with_loss(args: ModelArgs | None = None) -> TransformerWithLoss:
    _initialise_model_parallel()
    return TransformerWithLoss(args or ModelArgs())


def build_with_loss_quick() -> TransformerWithLoss:
    return build_with_loss(QUICK)


def example_inputs_with_targets(args: ModelArgs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and the next tokens to predict (class indices in [0, vocab_size))."""
    args = args or ModelArgs()
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(0, args.vocab_size, (2, 17), generator=generator)
    return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()


def example_inputs_with_targets_quick() -> tuple[torch.Tensor, torch.Tensor]:
    return example_inputs_with_targets(QUICK)


def example_inputs(args: ModelArgs | None = None) -> tuple[torch.Tensor]:
    args = args or ModelArgs()
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, args.vocab_size, (2, 16), generator=generator),)


def example_inputs_quick() -> tuple[torch.Tensor]:
    return example_inputs(QUICK)
