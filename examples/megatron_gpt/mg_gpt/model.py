"""A small GPT written once on Megatron-core's tensor-parallel layers, with and without sequence
parallelism; the same code at world size 1 is the reference.

Activations are sequence-first ([seq, batch, hidden]), as in Megatron. The token embedding is a
VocabParallelEmbedding; attention and MLP use ColumnParallelLinear / RowParallelLinear (the
fused QKV projection in Megatron's per-head [q, k, v] layout). With sequence parallelism the
hidden states between the tensor-parallel regions are split along the sequence: the embedding
output is scattered, the column-parallel layers all-gather their input, the row-parallel layers
reduce-scatter their output, and the norms run on sequence shards. `GPTWithLoss` is the training
forward: Megatron-core's vocab_parallel_cross_entropy of the logits sharded over the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_from_tensor_model_parallel_region,
    scatter_to_sequence_parallel_region,
    vocab_parallel_cross_entropy,
)
from torch import nn


@dataclass(frozen=True)
class GPTArgs:
    vocab_size: int = 256
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    ffn_hidden: int = 256
    sequence_parallel: bool = False


def keep(weight: torch.Tensor) -> torch.Tensor:
    """Weights come from a checkpoint: no random initialisation."""
    return weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, args: GPTArgs, config: ModelParallelConfig) -> None:
        super().__init__()
        world_size = config.tensor_model_parallel_size
        self.local_heads = args.heads // world_size
        self.head_dim = args.hidden // args.heads
        self.qkv = ColumnParallelLinear(
            args.hidden, 3 * args.hidden, config=config, init_method=keep, bias=True, gather_output=False
        )
        self.proj = RowParallelLinear(
            args.hidden,
            args.hidden,
            config=config,
            init_method=keep,
            bias=True,
            input_is_parallel=True,
            skip_bias_add=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv(x)
        seq, batch, _ = qkv.shape
        q, k, v = qkv.view(seq, batch, self.local_heads, 3 * self.head_dim).split(self.head_dim, dim=-1)
        out = F.scaled_dot_product_attention(
            q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), is_causal=True
        )
        out, _ = self.proj(out.permute(2, 0, 1, 3).reshape(seq, batch, -1))
        return out


class MLP(nn.Module):
    def __init__(self, args: GPTArgs, config: ModelParallelConfig) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(
            args.hidden, args.ffn_hidden, config=config, init_method=keep, bias=True, gather_output=False
        )
        self.fc2 = RowParallelLinear(
            args.ffn_hidden,
            args.hidden,
            config=config,
            init_method=keep,
            bias=True,
            input_is_parallel=True,
            skip_bias_add=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.fc1(x)
        out, _ = self.fc2(F.gelu(hidden))
        return out


class Block(nn.Module):
    def __init__(self, args: GPTArgs, config: ModelParallelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.hidden)
        self.attention = Attention(args, config)
        self.mlp_norm = RMSNorm(args.hidden)
        self.mlp = MLP(args, config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, args: GPTArgs, config: ModelParallelConfig) -> None:
        super().__init__()
        self.sequence_parallel = config.sequence_parallel
        self.embedding = VocabParallelEmbedding(args.vocab_size, args.hidden, init_method=keep, config=config)
        self.blocks = nn.ModuleList(Block(args, config) for _ in range(args.layers))
        self.norm = RMSNorm(args.hidden)
        self.output = ColumnParallelLinear(
            args.hidden, args.vocab_size, config=config, init_method=keep, bias=False, gather_output=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return gather_from_tensor_model_parallel_region(self.sharded_logits(tokens)).transpose(0, 1)

    def sharded_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[seq, batch, vocab / world size]: this rank's vocabulary shard of the logits."""
        h = self.embedding(tokens).transpose(0, 1).contiguous()  # [seq, batch, hidden]
        if self.sequence_parallel:
            h = scatter_to_sequence_parallel_region(h)
        for block in self.blocks:
            h = block(h)
        logits, _ = self.output(self.norm(h))  # all-gathers the sequence first under sequence parallelism
        return logits


class GPTWithLoss(GPT):
    """The training forward: the mean next-token loss by Megatron-core's vocab-parallel cross entropy."""

    label_smoothing = 0.0

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = self.sharded_logits(tokens)
        loss = vocab_parallel_cross_entropy(logits, targets.transpose(0, 1).contiguous(), self.label_smoothing)
        return loss.mean()


def build(args: GPTArgs | None = None, model_class: type[GPT] = GPT) -> GPT:
    args = args or GPTArgs()
    world_size = dist.get_world_size()
    # Megatron refuses sequence parallelism without tensor parallelism: off at world size 1.
    config = ModelParallelConfig(
        tensor_model_parallel_size=world_size,
        sequence_parallel=args.sequence_parallel and world_size > 1,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
    )
    return model_class(args, config)


def build_with_loss() -> GPT:
    return build(model_class=GPTWithLoss)


def build_sequence_parallel() -> GPT:
    return build(GPTArgs(sequence_parallel=True))


def example_inputs_with_targets() -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and the next token at every position (class indices in [0, vocab_size))."""
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(0, GPTArgs().vocab_size, (2, 17), generator=generator)
    return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, GPTArgs().vocab_size, (2, 16), generator=generator),)
