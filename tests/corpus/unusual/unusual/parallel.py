"""Parallel versions of the corpus references, each in one public framework's pattern (our own
small equivalents of what the named code does; nothing is copied from it)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .models import HEAD_DIM, HEADS, HIDDEN, SEQ, VOCAB


def _rows(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    block = weight.shape[0] // world_size
    return weight[rank * block : (rank + 1) * block].clone()


def _columns(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    block = weight.shape[1] // world_size
    return weight[:, rank * block : (rank + 1) * block].clone()


class BiasOnOneRank(nn.Module):
    """vLLM / SGLang RowParallelLinear: `bias_ = None if tp_rank > 0 else self.bias` (here also the
    last-rank variant), added to the partial sum before the all-reduce."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, carrier: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(_rows(ref.up.weight, rank, world_size))
        self.up_b = nn.Parameter(_rows(ref.up.bias, rank, world_size))
        self.down_w = nn.Parameter(_columns(ref.down.weight, rank, world_size))
        self.down_b = nn.Parameter(ref.down.bias.clone()) if rank == carrier else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w, self.down_b)
        dist.all_reduce(out)
        return out


def bias_on_first_rank(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BiasOnOneRank(ref, rank, world_size, carrier=0)


def bias_on_last_rank(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BiasOnOneRank(ref, rank, world_size, carrier=world_size - 1)


class PrescaledBias(BiasOnOneRank):
    """Every rank adds bias / world_size to its partial sum (Megatron's `skip_bias_add` alternative)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size, carrier=-1)
        self.share = nn.Parameter(ref.down.bias.clone() / world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w) + self.share
        dist.all_reduce(out)
        return out


def prescaled_bias(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PrescaledBias(ref, rank, world_size)


class ResidualOnFirstRank(BiasOnOneRank):
    """The residual folded into rank 0's partial sum, so one all-reduce gives x + mlp(x)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size, carrier=-1)
        self.rank = rank
        self.bias = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        if self.rank == 0:
            out = out + x
        dist.all_reduce(out)
        return out + self.bias


def residual_on_first_rank(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ResidualOnFirstRank(ref, rank, world_size)


class DeepSpeedLinears(BiasOnOneRank):
    """DeepSpeed AutoTP's LinearLayer / LinearAllreduce: `torch.matmul(x, W.transpose(-1, -2))`, the
    all-reduce, then the bias."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size, carrier=-1)
        self.bias = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(torch.matmul(x, self.up_w.transpose(-1, -2)) + self.up_b)
        out = torch.matmul(hidden, self.down_w.transpose(-1, -2))
        dist.all_reduce(out)
        return out + self.bias


def deepspeed_linears(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return DeepSpeedLinears(ref, rank, world_size)


class RoundRobin(nn.Module):
    """Hidden units dealt round-robin: rank r holds rows r, r + W, ... of the first linear and the
    matching columns of the second (correct: the contraction covers every unit once)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight[rank::world_size].clone())
        self.up_b = nn.Parameter(ref.up.bias[rank::world_size].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, rank::world_size].clone())
        self.bias = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(out)
        return out + self.bias


def round_robin(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RoundRobin(ref, rank, world_size)


class Uneven(nn.Module):
    """`torch.tensor_split`: uneven blocks of the hidden units when the world size does not divide them."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(torch.tensor_split(ref.up.weight, world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(torch.tensor_split(ref.up.bias, world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(torch.tensor_split(ref.down.weight, world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(out)
        return out + self.bias


def uneven(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return Uneven(ref, rank, world_size)


class ScatterThenGather(RoundRobin):
    """A reduce-scatter over the batch followed by an all-gather in place of the all-reduce
    (the sequence-parallel pair, as Megatron uses it around a block)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        nn.Module.__init__(self)
        self.up_w = nn.Parameter(_rows(ref.up.weight, rank, world_size))
        self.up_b = nn.Parameter(_rows(ref.up.bias, rank, world_size))
        self.down_w = nn.Parameter(_columns(ref.down.weight, rank, world_size))
        self.bias = nn.Parameter(ref.down.bias.clone())
        self.world_size = world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w).contiguous()
        part = torch.empty((out.shape[0] // self.world_size, *out.shape[1:]), dtype=out.dtype)
        dist.reduce_scatter_tensor(part, out)
        whole = torch.empty_like(out)
        dist.all_gather_into_tensor(whole, part)
        return whole + self.bias


def scatter_then_gather(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ScatterThenGather(ref, rank, world_size)


class SequenceFirstScatter(ScatterThenGather):
    """Megatron-LM's sequence parallelism on batch-first activations: the row-parallel partial sums
    are put sequence-first for the reduce-scatter (which splits dim 0), the bias is added to the
    rank's block of the sequence, and the gathered blocks are transposed back to batch-first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        out = out.transpose(0, 1).contiguous()  # [seq, batch, hidden]
        part = torch.empty((out.shape[0] // self.world_size, *out.shape[1:]), dtype=out.dtype, device=out.device)
        dist.reduce_scatter_tensor(part, out)
        whole = torch.empty_like(out)
        dist.all_gather_into_tensor(whole, (part + self.bias).contiguous())
        return whole.transpose(0, 1)


def sequence_first_scatter(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SequenceFirstScatter(ref, rank, world_size)


class Ulysses(nn.Module):
    """DeepSpeed-Ulysses: the sequence is sharded; an all-to-all turns it into head shards for
    attention over the whole sequence, and a second all-to-all turns it back."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.ref = ref
        self.rank, self.world_size = rank, world_size

    def _exchange(self, x: torch.Tensor, scatter: int, gather: int) -> torch.Tensor:
        sends = [part.contiguous() for part in x.chunk(self.world_size, dim=scatter)]
        received = [torch.empty_like(sends[0]) for _ in range(self.world_size)]
        dist.all_to_all(received, sends)
        return torch.cat(received, dim=gather)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        block = SEQ // self.world_size
        local = x[:, self.rank * block : (self.rank + 1) * block]
        q, k, v = (self._exchange(self.ref.heads(t), scatter=1, gather=2) for t in self.ref.qkv(local).chunk(3, dim=-1))
        out = self.ref.attend(q, *self._keys_for(q, k, v))  # [batch, local heads, whole sequence, head dim]
        out = self._exchange(out, scatter=2, gather=1)  # [batch, all heads, local sequence, head dim]
        out = self.ref.out(out.transpose(1, 2).reshape(x.shape[0], block, HIDDEN)).contiguous()
        parts = [torch.empty_like(out) for _ in range(self.world_size)]
        dist.all_gather(parts, out)
        return torch.cat(parts, dim=1)

    def _keys_for(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values the queries attend to (as exchanged)."""
        return k, v


def ulysses(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return Ulysses(ref, rank, world_size)


class UlyssesGroupedKeys(Ulysses):
    """Ulysses written for grouped-query attention: after the exchange the keys and values are
    repeated up to the query heads by a count the code computes (`q heads // kv heads`), here 1
    (multi-head attention: every head its own keys), as generic code does."""

    def _keys_for(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        groups = q.shape[1] // k.shape[1]
        return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def ulysses_grouped_keys(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return UlyssesGroupedKeys(ref, rank, world_size)


class RotaryHeads(nn.Module):
    """Tensor-parallel attention (heads split over ranks, the Megatron layout of a fused QKV) with
    interleaved GPT-J / Cohere rotary embeddings `x[..., ::2]`, `x[..., 1::2]`."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.ref = ref
        per = HIDDEN // world_size
        weight = ref.qkv.weight
        self.qkv_w = nn.Parameter(
            torch.cat([weight[i * HIDDEN + rank * per : i * HIDDEN + (rank + 1) * per] for i in range(3)]).clone()
        )
        self.out_w = nn.Parameter(_columns(ref.out.weight, rank, world_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = F.linear(x, self.qkv_w).chunk(3, dim=-1)
        out = self.ref.attend(self.ref.heads(q), self.ref.heads(k), self.ref.heads(v))
        out = F.linear(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1), self.out_w)
        dist.all_reduce(out)
        return out


def rotary_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return RotaryHeads(ref, rank, world_size)


class PaddedVocabulary(nn.Module):
    """vLLM's VocabParallelEmbedding: the vocabulary padded up to a multiple of the world size, each
    rank a block of the padded rows (the padding rows are never looked up), ids outside the block
    masked to 0 and their rows zeroed, then the all-reduce."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        padded = -(-VOCAB // world_size) * world_size
        block = padded // world_size
        self.start, self.end = rank * block, min((rank + 1) * block, VOCAB)
        table = torch.zeros(block, HIDDEN)
        table[: self.end - self.start] = ref.table.weight[self.start : self.end]
        self.table = nn.Parameter(table)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        local = torch.where(outside, 0, ids - self.start)
        rows = F.embedding(local, self.table).masked_fill(outside.unsqueeze(-1), 0.0)
        dist.all_reduce(rows)
        return rows


def padded_vocabulary(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return PaddedVocabulary(ref, rank, world_size)


class BroadcastBiasHeads(nn.Module):
    """Head-parallel attention scores; the per-position bias every head shares is expanded across
    heads and each rank takes its heads' slice of the expansion (every slice holds the same values)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.score_w = nn.Parameter(_rows(ref.score.weight, rank, world_size))
        self.bias = nn.Parameter(ref.bias.clone())
        self.rank, self.world_size = rank, world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = HEADS // self.world_size
        scores = F.linear(x, self.score_w).view(x.shape[0], SEQ, local, SEQ).transpose(1, 2)
        expanded = self.bias.expand(HEADS, SEQ, SEQ)
        mine = expanded[self.rank * local : (self.rank + 1) * local]
        out = (scores + mine).contiguous()
        parts = [torch.empty_like(out) for _ in range(self.world_size)]
        dist.all_gather(parts, out)
        return torch.cat(parts, dim=1)


def broadcast_bias_heads(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return BroadcastBiasHeads(ref, rank, world_size)


class GatheredSum(Uneven):
    """The partial sums all-gathered and added up locally: an all-reduce spelled another way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w).contiguous()
        parts = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, partial)
        return torch.stack(parts).sum(0) + self.bias


def gathered_sum(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return GatheredSum(ref, rank, world_size)


__all__ = ["HEAD_DIM"]
