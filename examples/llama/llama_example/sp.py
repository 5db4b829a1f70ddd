"""Tensor parallelism with sequence parallelism (the Megatron scheme), on the batch-first layout.

Between the tensor-parallel regions every rank holds its slice of the sequence: the norms and the
residual additions run on sequence shards. The sequence is all-gathered before each
column-parallel projection, and each row-parallel projection reduce-scatters its partial sums
along the sequence instead of all-reducing them. The layout is [batch, seq, dim], so both
collectives act on dim 1: the gathered chunks are concatenated along the sequence, and the
partial sums are split along the sequence before the reduce-scatter.

The modules and weights are those of tp.py; only their forward passes differ.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .model import Llama
from .tp import ParallelBlock, ParallelLlama, RowParallelLinear, VocabParallelEmbedding
from .tp import parallelize as parallelize_tp


def gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """[batch, seq / world, dim] on every rank -> [batch, seq, dim] in rank order."""
    world_size = dist.get_world_size()
    gathered = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(gathered, x.contiguous())
    return torch.cat(gathered.chunk(world_size, dim=0), dim=1)


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """Partial sums [batch, seq, dim] -> this rank's sequence slice of their sum."""
    world_size = dist.get_world_size()
    by_rank = torch.cat(x.chunk(world_size, dim=1), dim=0).contiguous()
    out = torch.empty((x.shape[0], x.shape[1] // world_size, x.shape[2]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, by_rank)
    return out


class SequenceParallelEmbedding(VocabParallelEmbedding):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.vocab_start) | (tokens >= self.vocab_end)
        local = (tokens - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside[..., None], 0.0)
        return reduce_scatter_sequence(out)


class SequenceParallelRowLinear(RowParallelLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias_share:
            return reduce_scatter_sequence(F.linear(x, self.weight, self.bias))
        return reduce_scatter_sequence(F.linear(x, self.weight)) + self.bias


class SequenceParallelBlock(ParallelBlock):
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(gather_sequence(self.attention_norm(x)), cos, sin)
        return h + self.feed_forward(gather_sequence(self.ffn_norm(h)))


class SequenceParallelLlama(ParallelLlama):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(gather_sequence(self.norm(h)))


@torch.no_grad()
def parallelize(reference: Llama, rank: int, world_size: int) -> SequenceParallelLlama:
    """The tensor-parallel model of tp.py, with sequence-parallel forward passes."""
    model = parallelize_tp(reference, rank, world_size)
    # Same parameters and shards; only the forward passes change, so re-class the modules.
    model.__class__ = SequenceParallelLlama
    model.tok_embeddings.__class__ = SequenceParallelEmbedding
    for layer in model.layers:
        layer.__class__ = SequenceParallelBlock
        layer.attention.wo.__class__ = SequenceParallelRowLinear
        layer.feed_forward.w_down.__class__ = SequenceParallelRowLinear
    return model
