"""Megatron-LM's tensor-parallel layers, mappings and losses (megatron/core/tensor_parallel/
layers.py, mappings.py, cross_entropy.py; legacy ParallelAttention): our own small equivalents,
nothing copied from their code."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .layer_variants import LABEL_SMOOTHING, Z_LOSS
from .models import HEAD_DIM, SEQ


def _reduce(x: torch.Tensor) -> torch.Tensor:
    """mappings._reduce: an in-place all-reduce over the tensor-parallel group."""
    dist.all_reduce(x)
    return x


def _split_along_last_dim(x: torch.Tensor) -> torch.Tensor:
    """mappings._split_along_last_dim: this rank's block of the last dimension."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    return x.split(x.shape[-1] // world_size, dim=-1)[rank].contiguous()


def _gather_along_last_dim(x: torch.Tensor) -> torch.Tensor:
    """mappings._gather_along_last_dim: gathered along the first dimension into one buffer
    (all_gather_into_tensor), then the world blocks of it concatenated along the last."""
    world_size = dist.get_world_size()
    out = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return torch.cat(out.chunk(world_size, dim=0), dim=-1).contiguous()


def _gather_along_first_dim(x: torch.Tensor) -> torch.Tensor:
    world_size = dist.get_world_size()
    out = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def _reduce_scatter_along_first_dim(x: torch.Tensor) -> torch.Tensor:
    world_size = dist.get_world_size()
    out = torch.empty((x.shape[0] // world_size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


def _split_along_first_dim(x: torch.Tensor) -> torch.Tensor:
    world_size, rank = dist.get_world_size(), dist.get_rank()
    return x.split(x.shape[0] // world_size, dim=0)[rank].contiguous()


class ColumnParallelLinear(nn.Module):
    """Rows [rank * out / ws, ...) of the weight and bias; `gather_output` gathers the output
    along its last dimension; `skip_bias_add` returns the bias for the caller to fuse."""

    def __init__(
        self, full: nn.Linear, rank: int, world_size: int, gather_output: bool, skip_bias_add: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(full.bias.chunk(world_size, dim=0)[rank].clone())
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = None if self.skip_bias_add else self.bias
        out = F.linear(x, self.weight, bias)
        if self.gather_output:
            out = _gather_along_last_dim(out)
        return out, (self.bias if self.skip_bias_add else None)


class RowParallelLinear(nn.Module):
    """Columns [rank * in / ws, ...) of the weight, the bias whole and added after the all-reduce;
    `input_is_parallel=False` splits a replicated input itself."""

    def __init__(
        self, full: nn.Linear, rank: int, world_size: int, input_is_parallel: bool, skip_bias_add: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(full.weight.chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.clone())
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.input_is_parallel:
            x = _split_along_last_dim(x)
        out = _reduce(F.linear(x, self.weight))
        if self.skip_bias_add:
            return out, self.bias
        return out + self.bias, None


class GatheredColumnMLP(nn.Module):
    """ColumnParallelLinear(gather_output=True) for the first linear; the second runs replicated."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = ColumnParallelLinear(ref.up, rank, world_size, gather_output=True)
        self.down = ref.down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.up(x)
        return self.down(F.gelu(hidden))


def column_gather_output(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return GatheredColumnMLP(ref, rank, world_size)


class SplitInputRowMLP(nn.Module):
    """RowParallelLinear(input_is_parallel=False) for the second linear; the first runs replicated."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = ref.up
        self.down = RowParallelLinear(ref.down, rank, world_size, input_is_parallel=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.down(F.gelu(self.up(x)))
        return out


def row_split_input(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SplitInputRowMLP(ref, rank, world_size)


class BiasGeluMLP(nn.Module):
    """ParallelMLP with `bias_gelu_fusion`: both linears `skip_bias_add=True`, the first bias fused
    into the activation (gelu(out + bias) on the rank's shard), the second added by the caller."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(ref.up, rank, world_size, gather_output=False, skip_bias_add=True)
        self.fc2 = RowParallelLinear(ref.down, rank, world_size, input_is_parallel=True, skip_bias_add=True)

    @staticmethod
    def bias_gelu(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.gelu(y + bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, bias = self.fc1(x)
        out, bias = self.fc2(self.bias_gelu(bias, hidden))
        return out + bias


def skip_bias_add(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BiasGeluMLP(ref, rank, world_size)


class SequenceParallelBlock(nn.Module):
    """Sequence parallelism ([s, b, h] activations): the input scattered along the sequence, the
    LayerNorm on the rank's sequence shard, all-gathered along the sequence before the
    column-parallel linear, reduce-scattered along it after the row-parallel one, bias and residual
    on the shard, and the shards gathered at the end (the model's output)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.norm = ref.norm
        self.fc1 = ColumnParallelLinear(ref.mlp.up, rank, world_size, gather_output=False)
        self.fc2_weight = nn.Parameter(ref.mlp.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.fc2_bias = nn.Parameter(ref.mlp.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _split_along_first_dim(x)  # scatter_to_sequence_parallel_region
        h = _gather_along_first_dim(self.norm(x))  # the column-parallel layer's sequence gather
        hidden, _ = self.fc1(h)
        out = _reduce_scatter_along_first_dim(F.linear(F.gelu(hidden), self.fc2_weight))
        return _gather_along_first_dim(x + out + self.fc2_bias)


def sequence_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceParallelBlock(ref, rank, world_size)


class BatchFirstSequenceParallelBlock(SequenceParallelBlock):
    """The sequence-parallel block in its own [s, b, h] layout inside a batch-first model (a
    Megatron layer dropped into a Hugging Face-style model): the activations are transposed on the
    way in and back on the way out, so the rank computes every value on the permuted layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(0, 1).contiguous()).transpose(0, 1)


def batch_first_sequence_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BatchFirstSequenceParallelBlock(ref, rank, world_size)


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token loss of vocabulary-sharded logits: the max all-reduced with MAX, the target's
    logit picked by a masked local index into the flattened logits (zero off its rank) and
    all-reduced, the exponentials' sum all-reduced."""
    rank, partition = dist.get_rank(), logits.shape[-1]
    start, end = rank * partition, (rank + 1) * partition
    logits_max = logits.max(dim=-1)[0]
    dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
    logits = logits - logits_max.unsqueeze(-1)
    target_mask = (target < start) | (target >= end)
    masked_target = target.clone() - start
    masked_target[target_mask] = 0
    logits_2d = logits.view(-1, partition)
    arange = torch.arange(logits_2d.shape[0], device=logits_2d.device)
    predicted = logits_2d[arange, masked_target.view(-1)].clone().view_as(target)
    predicted[target_mask] = 0.0
    dist.all_reduce(predicted)
    sum_exp = logits.exp().sum(dim=-1)
    dist.all_reduce(sum_exp)
    return torch.log(sum_exp) - predicted


class VocabParallelLoss(nn.Module):
    """The LM head column-parallel without gather (logits sharded over the vocabulary) and
    Megatron's vocab-parallel cross entropy, averaged over the tokens."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(F.linear(x, self.weight), targets).mean()


def cross_entropy(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelLoss(ref, rank, world_size)


class MaskedVocabParallelLoss(VocabParallelLoss):
    """Megatron's per-token loss averaged with the loss mask (the tokens whose label is not the
    ignore index), as its pretraining loop does: `(losses * loss_mask).sum() / loss_mask.sum()`."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss_mask = (targets != -100).float()
        losses = vocab_parallel_cross_entropy(F.linear(x, self.weight), targets)
        return (losses * loss_mask).sum() / loss_mask.sum()


def masked_cross_entropy(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MaskedVocabParallelLoss(ref, rank, world_size)


class VocabParallelSoftmax(nn.Module):
    """Softmax over vocabulary-sharded logits: the max all-reduced with MAX, the exponentials'
    sum all-reduced; each rank keeps the probabilities of its own vocabulary block."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        logits_max = logits.amax(dim=-1, keepdim=True)
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        exp = (logits - logits_max).exp()
        total = exp.sum(dim=-1, keepdim=True)
        dist.all_reduce(total)
        return exp / total


def softmax(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelSoftmax(ref, rank, world_size)


class VocabParallelZLoss(nn.Module):
    """The z-loss on vocabulary-sharded logits, as Megatron computes its cross entropy's
    logsumexp: each token's max taken without keeping the dim and all-reduced with MAX, the
    shifted exponentials summed and all-reduced, log of the sum plus the max."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.lm_head.weight.chunk(world_size, dim=0)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        logits_max = torch.max(logits, dim=-1)[0]
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        sum_exp = (logits - logits_max.unsqueeze(dim=-1)).exp().sum(dim=-1)
        dist.all_reduce(sum_exp)
        return Z_LOSS * (torch.log(sum_exp) + logits_max).pow(2)


def z_loss(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelZLoss(ref, rank, world_size)


class ParallelAttention(nn.Module):
    """Legacy ParallelAttention: query_key_value column-parallel over whole heads (Megatron's
    per-head [q; k; v] layout makes a rank's heads a contiguous block of rows), the scores scaled
    by the full head dim's square root (`norm_factor`, not divided by anything per rank), softmax
    in float32 for half inputs, dense row-parallel with the bias after the all-reduce."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        qkv = ref.query_key_value
        self.qkv_weight = nn.Parameter(qkv.weight.chunk(world_size, dim=0)[rank].clone())
        self.qkv_bias = nn.Parameter(qkv.bias.chunk(world_size, dim=0)[rank].clone())
        self.dense = RowParallelLinear(ref.dense, rank, world_size, input_is_parallel=True)
        self.norm_factor = ref.norm_factor
        self.register_buffer("causal", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        mixed = F.linear(x, self.qkv_weight, self.qkv_bias).view(s, b, -1, 3 * HEAD_DIM)
        q, k, v = mixed.split(HEAD_DIM, dim=-1)
        heads = q.shape[2]
        # baddbmm over [b * heads, s, t], as Megatron's CoreAttention does
        q2 = q.permute(1, 2, 0, 3).reshape(b * heads, s, HEAD_DIM)
        k2 = k.permute(1, 2, 3, 0).reshape(b * heads, HEAD_DIM, s)
        scores = torch.baddbmm(
            torch.zeros(b * heads, s, s, dtype=q.dtype, device=q.device), q2, k2, beta=0.0, alpha=1.0 / self.norm_factor
        ).view(b, heads, s, s)
        scores = scores.masked_fill(self.causal, float("-inf"))
        if scores.dtype in (torch.float16, torch.bfloat16):
            scores = scores.float()
        probs = F.softmax(scores, dim=-1).type_as(v)
        context = torch.bmm(probs.view(b * heads, s, s), v.permute(1, 2, 0, 3).reshape(b * heads, s, HEAD_DIM))
        context = context.view(b, heads, s, HEAD_DIM).permute(2, 0, 1, 3).reshape(s, b, heads * HEAD_DIM)
        out, _ = self.dense(context)
        return out


def parallel_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelAttention(ref, rank, world_size)


class GroupedQueryAttention(nn.Module):
    """Megatron-core's SelfAttention with query groups, loaded from a Hugging Face checkpoint:
    `linear_qkv` holds, group after group, the group's query heads, then its key head and its
    value head (the checkpoint converter's layout), column-parallel over whole groups; the rank
    views its output as [batch, seq, groups, (heads per group + 2) * head_dim] and splits it per
    group (get_query_key_value_tensors); `linear_proj` is row-parallel."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        heads, groups = ref.q_proj.out_features // HEAD_DIM, ref.k_proj.out_features // HEAD_DIM
        self.groups, self.per_group = groups // world_size, heads // groups
        rows = []
        for group in range(rank * self.groups, (rank + 1) * self.groups):
            queries = group * self.per_group * HEAD_DIM
            rows.append(ref.q_proj.weight[queries : queries + self.per_group * HEAD_DIM])
            rows.append(ref.k_proj.weight[group * HEAD_DIM : (group + 1) * HEAD_DIM])
            rows.append(ref.v_proj.weight[group * HEAD_DIM : (group + 1) * HEAD_DIM])
        self.linear_qkv = nn.Parameter(torch.cat(rows).clone())
        self.linear_proj = nn.Parameter(ref.o_proj.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        mixed = F.linear(x, self.linear_qkv).view(b, s, self.groups, (self.per_group + 2) * HEAD_DIM)
        query, key, value = torch.split(mixed, [self.per_group * HEAD_DIM, HEAD_DIM, HEAD_DIM], dim=3)
        query = query.reshape(b, s, -1, HEAD_DIM)
        key = key.repeat_interleave(self.per_group, dim=2)
        value = value.repeat_interleave(self.per_group, dim=2)
        scores = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal=True
        )
        return _reduce(F.linear(scores.transpose(1, 2).flatten(2), self.linear_proj))


def grouped_query_attention(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return GroupedQueryAttention(ref, rank, world_size)


class SequenceParallelVocabEmbedding(nn.Module):
    """Megatron-core's VocabParallelEmbedding under sequence parallelism: the masked lookup is
    transposed to the sequence-first layout and reduce-scattered along the sequence (instead of
    all-reduced), so each rank leaves with its block of the sequence."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        rows = ref.embed_tokens.num_embeddings // world_size
        self.start, self.end = rank * rows, (rank + 1) * rows
        self.weight = nn.Parameter(ref.embed_tokens.weight[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        masked = ids.clone() - self.start
        masked[outside] = 0
        rows = F.embedding(masked, self.weight)
        rows[outside, :] = 0.0
        return _reduce_scatter_along_first_dim(rows.transpose(0, 1)).transpose(0, 1)


def sequence_parallel_embedding(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceParallelVocabEmbedding(ref, rank, world_size)


def smoothing_terms(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The vocab-parallel cross entropy, the log of the all-reduced sum of the shifted
    exponentials and the all-reduced sum of the shifted logits: what label smoothing combines."""
    loss = vocab_parallel_cross_entropy(logits, target)
    logits_max = logits.max(dim=-1)[0]
    dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
    shifted = logits - logits_max.unsqueeze(-1)
    sum_exp = shifted.exp().sum(dim=-1)
    dist.all_reduce(sum_exp)
    sum_shifted = shifted.sum(dim=-1)
    dist.all_reduce(sum_shifted)
    return loss, torch.log(sum_exp), sum_shifted


def smoothed_vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab: int) -> torch.Tensor:
    """Megatron's vocab-parallel cross entropy with label smoothing: (1 - eps) times the loss plus
    eps times the mean over the vocabulary of -log_softmax, that mean from the all-reduced sum of
    the shifted logits."""
    loss, log_z, sum_shifted = smoothing_terms(logits, target)
    mean_negative_log_probs = log_z - sum_shifted / vocab
    return (1 - LABEL_SMOOTHING) * loss + LABEL_SMOOTHING * mean_negative_log_probs


class SmoothedVocabParallelLoss(VocabParallelLoss):
    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.vocab = ref.lm_head.weight.shape[0]

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return smoothed_vocab_parallel_cross_entropy(F.linear(x, self.weight), targets, self.vocab).mean()


def smoothed_cross_entropy(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SmoothedVocabParallelLoss(ref, rank, world_size)
