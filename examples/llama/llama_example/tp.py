"""Tensor-parallel version of the example model, written in the Megatron style.

Every rank builds its own modules with local shapes and loads its shard of the
reference weights (vocab-parallel embedding, column- and row-parallel linears with
explicit all-reduces, a packed QKV projection and a packed gate/up projection).
When there are fewer key/value heads than ranks, the key/value heads are replicated:
the ranks whose query heads share a key/value head all hold that head.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .model import Llama, LlamaConfig, RMSNorm, attend, repeat_kv, rotate_heads


def reduce_from_tp(x: torch.Tensor) -> torch.Tensor:
    """Sum the partial results of all tensor-parallel ranks."""
    dist.all_reduce(x)
    return x


def gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's slice of the last dimension."""
    world_size = dist.get_world_size()
    gathered = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(gathered, x.contiguous())
    return torch.cat(gathered.chunk(world_size, dim=0), dim=-1)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, rank: int, world_size: int) -> None:
        super().__init__()
        per_rank = vocab_size // world_size
        self.vocab_start = rank * per_rank
        self.vocab_end = self.vocab_start + per_rank
        self.weight = nn.Parameter(torch.empty(per_rank, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.vocab_start) | (tokens >= self.vocab_end)
        local = (tokens - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside[..., None], 0.0)
        return reduce_from_tp(out)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, local_out_features: int, gather_output: bool = False) -> None:
        super().__init__()
        self.gather_output = gather_output
        self.weight = nn.Parameter(torch.empty(local_out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return gather_last_dim(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Input split over ranks; partial results are all-reduced.

    With `bias_share=True` the bias parameter holds this rank's 1/world_size share of the
    reference bias and is added before the reduction (the DTensor convention); otherwise
    the full bias is added once, after the reduction (the Megatron convention).
    """

    def __init__(self, local_in_features: int, out_features: int, world_size: int, bias_share: bool = False) -> None:
        super().__init__()
        self.world_size = world_size
        self.bias_share = bias_share
        self.weight = nn.Parameter(torch.empty(out_features, local_in_features))
        self.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias_share:
            return reduce_from_tp(F.linear(x, self.weight, self.bias))
        return reduce_from_tp(F.linear(x, self.weight)) + self.bias


class ParallelAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, rank: int, world_size: int) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.n_local_heads = cfg.n_heads // world_size
        self.n_local_kv_heads = max(1, cfg.n_kv_heads // world_size)
        self.rank = rank
        local_rows = (self.n_local_heads + 2 * self.n_local_kv_heads) * self.head_dim
        self.wqkv = ColumnParallelLinear(cfg.dim, local_rows)
        self.wo = RowParallelLinear(self.n_local_heads * self.head_dim, cfg.dim, world_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.wqkv(x).view(b, s, self.n_local_heads + 2 * self.n_local_kv_heads, self.head_dim)
        qkv = rotate_heads(qkv, cos, sin, start=0, count=self.n_local_heads + self.n_local_kv_heads)
        q, k, v = qkv.split([self.n_local_heads, self.n_local_kv_heads, self.n_local_kv_heads], dim=2)
        repeats = self.n_local_heads // self.n_local_kv_heads
        out = attend(q, repeat_kv(k, repeats), repeat_kv(v, repeats))
        return self.wo(out)


class ParallelFeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig, world_size: int) -> None:
        super().__init__()
        local_ffn = cfg.ffn_dim // world_size
        self.w_gate_up = ColumnParallelLinear(cfg.dim, 2 * local_ffn)
        self.w_down = RowParallelLinear(local_ffn, cfg.dim, world_size, bias_share=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class ParallelBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig, rank: int, world_size: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = ParallelAttention(cfg, rank, world_size)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = ParallelFeedForward(cfg, world_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class ParallelLlama(nn.Module):
    def __init__(self, cfg: LlamaConfig, rank: int, world_size: int) -> None:
        super().__init__()
        self.tok_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.dim, rank, world_size)
        self.layers = nn.ModuleList(ParallelBlock(cfg, rank, world_size) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = ColumnParallelLinear(cfg.dim, cfg.vocab_size // world_size, gather_output=True)
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def shard(weight: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous 1/world_size block of `weight` along `dim`."""
    return weight.chunk(world_size, dim=dim)[rank]


@torch.no_grad()
def load_attention(attn: ParallelAttention, ref: nn.Module, cfg: LlamaConfig, rank: int, world_size: int) -> None:
    hd = cfg.head_dim
    q_rows, k_rows, v_rows = ref.wqkv.weight.split([cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd])
    kv_rows = attn.n_local_kv_heads * hd
    # With fewer key/value heads than ranks, consecutive ranks share (replicate) one head.
    q_local = shard(q_rows, 0, rank, world_size)
    k_local = k_rows.narrow(0, (rank * cfg.n_kv_heads // world_size) * hd, kv_rows)
    v_local = v_rows.narrow(0, (rank * cfg.n_kv_heads // world_size) * hd, kv_rows)
    attn.wqkv.weight.copy_(torch.cat([q_local, k_local, v_local]))
    attn.wo.weight.copy_(shard(ref.wo.weight, 1, rank, world_size))
    attn.wo.bias.copy_(ref.wo.bias)


@torch.no_grad()
def load_feed_forward(ffn: ParallelFeedForward, ref: nn.Module, rank: int, world_size: int) -> None:
    gate = shard(ref.w_gate.weight, 0, rank, world_size)
    up = shard(ref.w_up.weight, 0, rank, world_size)
    ffn.w_gate_up.weight.copy_(torch.cat([gate, up]))
    ffn.w_down.weight.copy_(shard(ref.w_down.weight, 1, rank, world_size))
    ffn.w_down.bias.copy_(ref.w_down.bias / world_size)


@torch.no_grad()
def parallelize(
    reference: Llama, rank: int, world_size: int, model_class: type[ParallelLlama] = ParallelLlama
) -> ParallelLlama:
    """Build this rank's tensor-parallel model and load its shard of the reference weights."""
    cfg = reference.cfg
    model = model_class(cfg, rank, world_size)
    model.tok_embeddings.weight.copy_(shard(reference.tok_embeddings.weight, 0, rank, world_size))
    for layer, ref_layer in zip(model.layers, reference.layers, strict=True):
        layer.attention_norm.weight.copy_(ref_layer.attention_norm.weight)
        layer.ffn_norm.weight.copy_(ref_layer.ffn_norm.weight)
        load_attention(layer.attention, ref_layer.attention, cfg, rank, world_size)
        load_feed_forward(layer.feed_forward, ref_layer.feed_forward, rank, world_size)
    model.norm.weight.copy_(reference.norm.weight)
    model.output.weight.copy_(shard(reference.output.weight, 0, rank, world_size))
    model.register_buffer("rope_cos", reference.rope_cos, persistent=False)
    model.register_buffer("rope_sin", reference.rope_sin, persistent=False)
    return model
