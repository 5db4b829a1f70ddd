"""Further patterns: a fused [q; k; v] weight sharded per section into a new module (Hugging Face /
DeepSpeed AutoTP's fused-QKV handling), a ceil-division column split with a shorter last rank
(vLLM / Megatron's `divide` rounding up), expert parallelism with whole experts per rank
(DeepSpeed-MoE / Megatron's expert-parallel MLP without all-to-all) and with Megatron-core's
all-gather token dispatcher under sequence parallelism, Qwen2-MoE's shared expert (vLLM: its
partial sums added to the routed experts' before one all-reduce), and fairscale's
ParallelEmbedding (the table split along the hidden dimension). Our own small equivalents."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .layer_variants import Z_LOSS
from .long_context import _gathered_sequence
from .megatron import VocabParallelZLoss
from .models import EXPERTS, HEAD_DIM, causal_attention


class SectionedQKV(nn.Module):
    """The fused weight's q, k and v sections each sharded by rows and concatenated per rank;
    torch.split by the local section sizes in the forward; wo row-parallel."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        q_size, kv_size = ref.n_head * HEAD_DIM, ref.n_local_heads * HEAD_DIM
        sections = ref.wqkv.weight.split([q_size, kv_size, kv_size], dim=0)
        self.qkv = nn.Parameter(torch.cat([section.chunk(world_size, dim=0)[rank] for section in sections]).clone())
        self.sizes = [q_size // world_size, kv_size // world_size, kv_size // world_size]
        self.wo = nn.Parameter(ref.wo.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = torch.split(F.linear(x, self.qkv), self.sizes, dim=-1)
        out = F.linear(causal_attention(*(t.reshape(b, s, -1, HEAD_DIM) for t in (q, k, v))), self.wo)
        dist.all_reduce(out)
        return out


def sectioned_qkv(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SectionedQKV(ref, rank, world_size)


class CeilColumnMLP(nn.Module):
    """Hidden units split in blocks of ceil(ffn / world_size): every rank a full block but the
    last, which holds what remains."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        ffn = ref.up.weight.shape[0]
        block = -(-ffn // world_size)
        start, end = rank * block, min((rank + 1) * block, ffn)
        self.up_w = nn.Parameter(ref.up.weight[start:end].clone())
        self.up_b = nn.Parameter(ref.up.bias[start:end].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, start:end].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(out)
        return out + self.down_b


def ceil_columns(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return CeilColumnMLP(ref, rank, world_size)


class ExpertParallelMoE(nn.Module):
    """Every rank routes all tokens with the replicated router and runs only its own experts
    (experts [rank * E / ws, (rank + 1) * E / ws)), each output weighted by the token's gate for
    that expert (zero when not chosen); the ranks' sums are all-reduced."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        per_rank = EXPERTS // world_size
        self.first = rank * per_rank
        self.router = ref.router
        self.route = ref.route
        self.experts = nn.ModuleList(ref.experts[self.first : self.first + per_rank])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for offset, expert in enumerate(self.experts):
            mask = chosen == self.first + offset
            gate = (weights * mask).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        dist.all_reduce(out)
        return out


def expert_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ExpertParallelMoE(ref, rank, world_size)


class SharedExpertParallelMoE(nn.Module):
    """vLLM's Qwen2-MoE: whole experts per rank, and the shared expert tensor-parallel (column-parallel
    up, row-parallel down) with its output not reduced on its own: scaled by the replicated gate and
    added to the rank's experts' sum, so one all-reduce adds both."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.routed = ExpertParallelMoE(ref.moe, rank, world_size)
        columns = ref.shared_up.out_features // world_size
        own = slice(rank * columns, (rank + 1) * columns)
        self.shared_up = nn.Parameter(ref.shared_up.weight[own].detach().clone())
        self.shared_down = nn.Parameter(ref.shared_down.weight[:, own].detach().clone())
        self.shared_gate = ref.shared_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.routed.route(x)
        out = torch.zeros_like(x)
        for offset, expert in enumerate(self.routed.experts):
            gate = (weights * (chosen == self.routed.first + offset)).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        shared = F.linear(F.silu(F.linear(x, self.shared_up)), self.shared_down)  # this rank's partial sum
        out = out + torch.sigmoid(self.shared_gate(x)) * shared
        dist.all_reduce(out)
        return out


def shared_expert_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return SharedExpertParallelMoE(ref, rank, world_size)


class TensorParallelTokensMoE(nn.Module):
    """DeepSpeed-MoE with its expert-parallel group the tensor-parallel one (tokens replicated): each
    rank keeps its block of every expert's slots (`drop_tokens`), sends each expert block to the rank
    owning it (all-to-all), runs its experts on every rank's slots, sends the outputs back and
    all-gathers the slots (`gather_tokens`)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.local = EXPERTS // world_size
        first = rank * self.local
        self.gate = ref.gate
        self.route = ref.route
        self.w1 = nn.Parameter(ref.w1.detach()[first : first + self.local].clone())
        self.w2 = nn.Parameter(ref.w2.detach()[first : first + self.local].clone())
        self.rank, self.world_size = rank, world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.shape[-1]
        tokens = x.reshape(-1, hidden)
        dispatch, combine = self.route(tokens)
        dispatched = torch.einsum("tec,th->ech", dispatch, tokens)
        mine = dispatched.chunk(self.world_size, dim=1)[self.rank].contiguous()
        received = torch.empty_like(mine)
        dist.all_to_all_single(received, mine)  # [source rank's slots of my experts]
        grouped = received.reshape(self.world_size, self.local, -1, hidden)
        outputs = [F.gelu(slots @ self.w1[e]) @ self.w2[e] for e, slots in enumerate(grouped.chunk(self.local, dim=1))]
        out = torch.cat(outputs, dim=1).reshape(EXPERTS, -1, hidden)
        back = torch.empty_like(out)
        dist.all_to_all_single(back, out)  # every expert's outputs for my slots
        expert_out = _gathered_sequence(back, self.world_size, dim=1)
        return torch.einsum("tec,ech->th", combine, expert_out).view_as(x)


def tensor_parallel_tokens_moe(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return TensorParallelTokensMoE(ref, rank, world_size)


class AllGatherDispatchMoE(ExpertParallelMoE):
    """Megatron-core's all-gather token dispatcher with sequence parallelism, batch first: each rank
    holds a block of the sequence, all-gathers every rank's tokens, routes them all and runs its own
    experts on them; the partial sums go back to sequence blocks with a reduce-scatter, which
    splits dim 0, so the sequence is moved to the front for it and back after."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__(ref, rank, world_size)
        self.rank, self.world_size = rank, world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        rows = seq // self.world_size
        mine = x[:, self.rank * rows : (self.rank + 1) * rows]
        tokens = _gathered_sequence(mine, self.world_size, dim=1)
        weights, chosen = self.route(tokens)
        partial = torch.zeros_like(tokens)
        for offset, expert in enumerate(self.experts):
            gate = (weights * (chosen == self.first + offset)).sum(-1, keepdim=True)
            partial = partial + gate * expert(tokens)
        out = torch.empty(rows, batch, hidden)
        dist.reduce_scatter_tensor(out, partial.transpose(0, 1).contiguous())
        return _gathered_sequence(out.transpose(0, 1), self.world_size, dim=1)


def all_gather_dispatch_moe(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return AllGatherDispatchMoE(ref, rank, world_size)


class HiddenShardedEmbedding(nn.Module):
    """fairscale's ParallelEmbedding: each rank holds a block of the table's columns, looks every
    id up, and the blocks are all-gathered and concatenated along the hidden dimension."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(ref.embed_tokens.weight.chunk(world_size, dim=1)[rank].clone())
        self.world_size = world_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = F.embedding(ids, self.weight).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=-1)


def hidden_sharded_embedding(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return HiddenShardedEmbedding(ref, rank, world_size)


def _gathered_parameter(shard: torch.Tensor, shape: torch.Size, world_size: int) -> torch.Tensor:
    """A ZeRO-3 / FSDP parameter: every rank's flat shard all-gathered, the padding cut off, viewed
    back to the parameter's shape."""
    full = torch.empty(shard.numel() * world_size, dtype=shard.dtype, device=shard.device)
    dist.all_gather_into_tensor(full, shard)
    return full[: shape.numel()].view(shape)


class ZeroStage3MLP(nn.Module):
    """DeepSpeed ZeRO-3 (FSDP's flat parameters): every parameter flattened, padded to a multiple
    of the world size and split evenly over the ranks; each forward gathers the parameters it
    uses and runs the whole MLP on the rank's block of the batch; the outputs are gathered."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size
        self.shapes: dict[str, torch.Size] = {}
        for name, parameter in ref.named_parameters():
            flat = parameter.detach().flatten()
            flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world_size)])
            key = name.replace(".", "_")
            self.shapes[key] = parameter.shape
            self.register_parameter(key, nn.Parameter(flat.chunk(world_size)[rank].clone()))

    def gathered(self, key: str) -> torch.Tensor:
        return _gathered_parameter(getattr(self, key), self.shapes[key], self.world_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] // self.world_size
        mine = x[self.rank * rows : (self.rank + 1) * rows]
        hidden = F.gelu(F.linear(mine, self.gathered("up_weight"), self.gathered("up_bias")))
        out = F.linear(hidden, self.gathered("down_weight"), self.gathered("down_bias"))
        pieces = [torch.empty_like(out) for _ in range(self.world_size)]
        dist.all_gather(pieces, out.contiguous())
        return torch.cat(pieces, dim=0)


def zero_stage3_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ZeroStage3MLP(ref, rank, world_size)


class KeptDimsZLoss(VocabParallelZLoss):
    """The z-loss on vocabulary shards with a hand-written logsumexp that keeps the reduced dim
    throughout (the max and the sum with keepdim=True, all-reduced with MAX and SUM) and squeezes
    it at the end."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        largest = logits.amax(dim=-1, keepdim=True)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        total = (logits - largest).exp().sum(dim=-1, keepdim=True)
        dist.all_reduce(total)
        return Z_LOSS * (total.log() + largest).squeeze(-1).pow(2)


def kept_dims_z_loss(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return KeptDimsZLoss(ref, rank, world_size)


class StackedExpertsTensorParallel(nn.Module):
    """Stacked experts under tensor parallelism with the gate and up weights kept apart: every rank
    holds every expert's block of the intermediate dim and reduces the routed sum once."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        block = ref.w_gate.shape[1] // world_size
        own = slice(rank * block, (rank + 1) * block)
        self.gate, self.routing = ref.gate, ref.routing  # the router replicated
        self.w_gate = nn.Parameter(ref.w_gate[:, own].detach().clone())
        self.w_up = nn.Parameter(ref.w_up[:, own].detach().clone())
        self.w_down = nn.Parameter(ref.w_down[:, :, own].detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.einsum("bsh,efh->bsef", x, self.w_gate)
        hidden = F.silu(gate) * torch.einsum("bsh,efh->bsef", x, self.w_up)
        out = torch.einsum("bsef,ehf->bseh", hidden, self.w_down)
        routed = (self.routing(x).unsqueeze(-1) * out).sum(-2)
        dist.all_reduce(routed)
        return routed


def stacked_experts_tensor_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return StackedExpertsTensorParallel(ref, rank, world_size)


class DataParallelLoss(nn.Module):
    """Data parallelism's loss: each rank the mean loss of its block of the batch, the means
    all-reduced and divided by the world size (DDP's averaging)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.lm_head, self.rank, self.world_size = ref.lm_head, rank, world_size

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] // self.world_size
        mine = slice(self.rank * rows, (self.rank + 1) * rows)
        logits = self.lm_head(x[mine])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[mine].reshape(-1))
        dist.all_reduce(loss)
        return loss / self.world_size


def data_parallel_loss(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return DataParallelLoss(ref, rank, world_size)
