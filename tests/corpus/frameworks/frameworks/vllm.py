"""vLLM and SGLang tensor-parallel layers (model_executor/layers/linear.py, vocab_parallel_embedding.py,
logits_processor.py and SGLang's equivalents): our own small equivalents, each rank's weights filled
the way their weight loaders fill them (a zero parameter of the local shape, shards narrowed and
copied in), nothing copied from their code."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .latent_attention import KV_RANK, MLA_HEADS, NOPE_DIM, Q_RANK, ROPE_DIM, V_DIM, LatentAttention
from .models import HEAD_DIM, HEADS, HIDDEN, ODD_VOCAB, VOCAB, causal_attention


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """vLLM's helper: an in-place sum over the tensor-parallel group, returning the tensor."""
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """vLLM's GroupCoordinator.all_gather: the ranks' tensors gathered along the first dimension
    (all_gather_into_tensor), viewed with a leading world dimension, that moved next to `dim` and
    merged into it."""
    world_size = dist.get_world_size()
    dim = dim % x.dim()
    gathered = torch.empty((world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(gathered, x.contiguous())
    stacked = gathered.reshape(world_size, *x.shape).movedim(0, dim)
    return stacked.reshape(*x.shape[:dim], world_size * x.shape[dim], *x.shape[dim + 1 :])


def _load_rows(param: torch.Tensor, offset: int, loaded: torch.Tensor, shard: int, size: int) -> None:
    """A weight loader's copy: `size` rows of the checkpoint tensor, block `shard`, into the
    parameter at row `offset`."""
    with torch.no_grad():
        param.narrow(0, offset, size).copy_(loaded.narrow(0, shard * size, size))


class MergedColumnSwiGLU(nn.Module):
    """MergedColumnParallelLinear for gate_up_proj (each rank holds [gate shard; up shard]),
    SiluAndMul on the two halves, then RowParallelLinear (down_proj) with reduce_results."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        ffn = ref.gate_proj.weight.shape[0] // world_size
        self.gate_up_proj = nn.Parameter(torch.zeros(2 * ffn, HIDDEN))
        for index, loaded in enumerate((ref.gate_proj.weight, ref.up_proj.weight)):  # loaded_shard_id 0, 1
            _load_rows(self.gate_up_proj, index * ffn, loaded, rank, ffn)
        self.down_proj = nn.Parameter(ref.down_proj.weight.tensor_split(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(x, self.gate_up_proj)
        half = gate_up.shape[-1] // 2
        hidden = F.silu(gate_up[..., :half]) * gate_up[..., half:]
        return tensor_model_parallel_all_reduce(F.linear(hidden, self.down_proj))


def merged_column(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MergedColumnSwiGLU(ref, rank, world_size)


class QKVParallelAttention(nn.Module):
    """QKVParallelLinear: rank r's fused weight is [q heads of r; its kv head(s); the same for v].
    With fewer kv heads than ranks each kv head is replicated on world_size / n_kv ranks (rank r
    holds kv head r // replicas); o_proj is a RowParallelLinear."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int, loader: bool) -> None:
        super().__init__()
        total_kv = ref.k_proj.weight.shape[0] // HEAD_DIM
        replicas = max(1, world_size // total_kv)
        self.q_size = HEADS // world_size * HEAD_DIM
        self.kv_size = max(1, total_kv // world_size) * HEAD_DIM
        kv_shard = rank // replicas
        if loader:  # the weight loader: narrow the fused parameter per shard id and copy
            self.qkv = nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size, HIDDEN))
            _load_rows(self.qkv, 0, ref.q_proj.weight, rank, self.q_size)
            _load_rows(self.qkv, self.q_size, ref.k_proj.weight, kv_shard, self.kv_size)
            _load_rows(self.qkv, self.q_size + self.kv_size, ref.v_proj.weight, kv_shard, self.kv_size)
        else:
            q = ref.q_proj.weight[rank * self.q_size : (rank + 1) * self.q_size]
            rows = slice(kv_shard * self.kv_size, (kv_shard + 1) * self.kv_size)
            k, v = ref.k_proj.weight[rows], ref.v_proj.weight[rows]
            self.qkv = nn.Parameter(torch.cat([q, k, v]).clone())
        self.o_proj = nn.Parameter(ref.o_proj.weight.chunk(world_size, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = F.linear(x, self.qkv).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        out = causal_attention(*(t.view(b, s, -1, HEAD_DIM) for t in (q, k, v)))
        return tensor_model_parallel_all_reduce(F.linear(out, self.o_proj))


def qkv_replicated_kv(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return QKVParallelAttention(ref, rank, world_size, loader=False)


def qkv_loader(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return QKVParallelAttention(ref, rank, world_size, loader=True)


class ParallelLMHeadGather(nn.Module):
    """ParallelLMHead + LogitsProcessor: the vocabulary padded up to a multiple of 4 * world_size
    (the padding rows zero), each rank the logits of its block, all-gathered along the vocabulary
    and the padding cut off (`logits[..., :org_vocab_size]`)."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        multiple = 4 * world_size
        padded = -(-ODD_VOCAB // multiple) * multiple
        block = padded // world_size
        start, end = rank * block, min((rank + 1) * block, ODD_VOCAB)
        weight = torch.zeros(block, HIDDEN)
        weight[: max(0, end - start)] = ref.lm_head.weight[start:end]
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = tensor_model_parallel_all_gather(F.linear(x, self.weight), dim=-1)
        return logits[..., :ODD_VOCAB]


def lm_head_gather(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelLMHeadGather(ref, rank, world_size)


class VocabParallelEmbedding(nn.Module):
    """VocabParallelEmbedding without padding: the ids masked arithmetically (`mask * (ids -
    start * mask)`), the local lookup, rows of ids outside the shard zeroed in place, the all-reduce."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        block = VOCAB // world_size
        self.start, self.end = rank * block, (rank + 1) * block
        self.weight = nn.Parameter(ref.embed_tokens.weight[self.start : self.end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        vocab_mask = (ids >= self.start) & (ids < self.end)
        masked = vocab_mask * (ids - self.start * vocab_mask)
        out = F.embedding(masked, self.weight)
        out.masked_fill_(~vocab_mask.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(out)


def vocab_embedding(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return VocabParallelEmbedding(ref, rank, world_size)


class ParallelResidualReduceOnce(nn.Module):
    """SGLang's Falcon / GPT-J layer: o_proj and down_proj are RowParallelLinear with
    reduce_results=False, their partial sums are added and all-reduced once, then the bias of
    down_proj and the residual."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.norm = ref.norm
        attn, mlp = ref.attn, ref.mlp
        self.qkv = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN // world_size, bias=False) for _ in range(3))
        with torch.no_grad():
            for local, full in zip(self.qkv, (attn.q_proj, attn.k_proj, attn.v_proj), strict=True):
                local.weight.copy_(full.weight.chunk(world_size, dim=0)[rank])
        self.o_proj = nn.Parameter(attn.o_proj.weight.chunk(world_size, dim=1)[rank].clone())
        self.up_w = nn.Parameter(mlp.up.weight.chunk(world_size, dim=0)[rank].clone())
        self.up_b = nn.Parameter(mlp.up.bias.chunk(world_size, dim=0)[rank].clone())
        self.down_w = nn.Parameter(mlp.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(mlp.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm(x)
        q, k, v = (proj(h).view(b, s, -1, HEAD_DIM) for proj in self.qkv)
        attn_partial = F.linear(causal_attention(q, k, v), self.o_proj)
        mlp_partial = F.linear(F.gelu(F.linear(h, self.up_w, self.up_b)), self.down_w)
        out = tensor_model_parallel_all_reduce(attn_partial + mlp_partial)
        return x + out + self.down_b


def parallel_residual(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return ParallelResidualReduceOnce(ref, rank, world_size)


class MambaMixerShards(nn.Module):
    """vLLM's MambaMixer under tensor parallelism: `in_proj` a MergedColumnParallelLinear (the
    rank's block of x and its block of z in one weight), the depthwise conv1d's weight (viewed as
    [channels, kernel]) and bias a ColumnParallelLinear's (the rank's channels), `out_proj` a
    RowParallelLinear; the convolution runs on the rank's channels alone."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        x_part, z_part = ref.in_proj.weight.chunk(2, dim=0)
        shard = x_part.shape[0] // world_size
        self.in_proj = nn.Parameter(torch.zeros(2 * shard, x_part.shape[1]))
        self.conv_weight = nn.Parameter(torch.zeros(shard, ref.conv1d.weight.shape[-1]))
        self.conv_bias = nn.Parameter(torch.zeros(shard))
        self.out_proj = nn.Parameter(torch.zeros(ref.out_proj.weight.shape[0], shard))
        with torch.no_grad():
            for index, part in enumerate((x_part, z_part)):
                self.in_proj[index * shard : (index + 1) * shard].copy_(part.narrow(0, rank * shard, shard))
            filters = ref.conv1d.weight.view(-1, ref.conv1d.weight.shape[-1])
            self.conv_weight.copy_(filters.narrow(0, rank * shard, shard))
            self.conv_bias.copy_(ref.conv1d.bias.narrow(0, rank * shard, shard))
            self.out_proj.copy_(ref.out_proj.weight.narrow(1, rank * shard, shard))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x, z = F.linear(hidden, self.in_proj).chunk(2, dim=-1)
        channels, width = self.conv_weight.shape
        weight = self.conv_weight.view(channels, 1, width)
        x = F.conv1d(x.transpose(1, 2), weight, self.conv_bias, padding=width - 1, groups=channels)
        x = x[..., : hidden.shape[1]].transpose(1, 2)
        return tensor_model_parallel_all_reduce(F.linear(F.silu(x) * F.silu(z), self.out_proj))


def mamba_mixer(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return MambaMixerShards(ref, rank, world_size)


class LoRATensorParallelMLP(nn.Module):
    """vLLM's LoRA layers: on the column-parallel `up`, LoRA A whole and B cut like the base's
    rows (each rank adds its block of B's output); on the row-parallel `down`, LoRA A cut like the
    base's columns, its (partial) output all-reduced before B, whole, is applied and added to the
    reduced base output."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.up_w = nn.Parameter(ref.up.weight.chunk(world_size)[rank].clone())
        self.up_b = nn.Parameter(ref.up.bias.chunk(world_size)[rank].clone())
        self.up_lora_a = nn.Parameter(ref.up_lora_a.weight.clone())
        self.up_lora_b = nn.Parameter(ref.up_lora_b.weight.chunk(world_size)[rank].clone())
        self.down_w = nn.Parameter(ref.down.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())
        self.down_lora_a = nn.Parameter(ref.down_lora_a.weight.chunk(world_size, dim=1)[rank].clone())
        self.down_lora_b = nn.Parameter(ref.down_lora_b.weight.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lora_up = F.linear(F.linear(x, self.up_lora_a), self.up_lora_b)
        h = F.gelu(F.linear(x, self.up_w, self.up_b) + lora_up)
        shrunk = tensor_model_parallel_all_reduce(F.linear(h, self.down_lora_a))
        out = tensor_model_parallel_all_reduce(F.linear(h, self.down_w))
        return out + self.down_b + F.linear(shrunk, self.down_lora_b)


def lora_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return LoRATensorParallelMLP(ref, rank, world_size)


class Int8TensorParallelMLP(nn.Module):
    """Weight-only int8 quantization under tensor parallelism (vLLM's per-channel scheme): the
    int8 weights cut like the float ones, the column-parallel layer's scales cut with its rows,
    the row-parallel layer's scales whole; dequantized on the rank, partial sums all-reduced."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        self.register_buffer("up_q", ref.up_q.chunk(world_size)[rank].clone())
        self.up_scale = nn.Parameter(ref.up_scale.chunk(world_size)[rank].clone())
        self.register_buffer("down_q", ref.down_q.chunk(world_size, dim=1)[rank].clone())
        self.down_scale = nn.Parameter(ref.down_scale.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_q.to(x.dtype) * self.up_scale[:, None]
        down = self.down_q.to(x.dtype) * self.down_scale[:, None]
        return tensor_model_parallel_all_reduce(F.linear(F.gelu(F.linear(x, up)), down))


def int8_mlp(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return Int8TensorParallelMLP(ref, rank, world_size)


class FusedMoETensorParallel(nn.Module):
    """vLLM's FusedMoE under tensor parallelism (no expert parallelism): every rank holds every
    expert, each cut along its intermediate dim (gate and up by rows, merged as w13; down by
    columns), runs all of them on its block and reduces the routed sum once."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        block = ref.w_gate.shape[1] // world_size
        own = slice(rank * block, (rank + 1) * block)
        self.gate, self.routing = ref.gate, ref.routing  # the router replicated
        self.w13 = nn.Parameter(torch.cat([ref.w_gate[:, own], ref.w_up[:, own]], dim=1).detach().clone())
        self.w2 = nn.Parameter(ref.w_down[:, :, own].detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.einsum("bsh,efh->bsef", x, self.w13).chunk(2, dim=-1)
        out = torch.einsum("bsef,ehf->bseh", F.silu(gate) * up, self.w2)
        return tensor_model_parallel_all_reduce((self.routing(x).unsqueeze(-1) * out).sum(-2))


def fused_moe_tensor_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return FusedMoETensorParallel(ref, rank, world_size)


class LatentAttentionTensorParallel(LatentAttention):
    """vLLM / SGLang's DeepSeek-V2 attention under tensor parallelism: the query's down projection
    and the compressed latent replicated, the query's up projection and kv_b_proj column-parallel
    over whole heads, o_proj row-parallel and all-reduced (each local weight a zero parameter the
    loader narrows the checkpoint's into)."""

    def __init__(self, ref: LatentAttention, rank: int, world_size: int) -> None:
        super().__init__()
        self.heads = MLA_HEADS // world_size
        query_rows, kv_rows = self.heads * (NOPE_DIM + ROPE_DIM), self.heads * (NOPE_DIM + V_DIM)
        self.q_b_proj = nn.Linear(Q_RANK, query_rows, bias=False)
        self.kv_b_proj = nn.Linear(KV_RANK, kv_rows, bias=False)
        self.o_proj = nn.Linear(self.heads * V_DIM, HIDDEN, bias=False)
        with torch.no_grad():
            for name in ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm"):
                getattr(self, name).weight.copy_(getattr(ref, name).weight)
            self.q_b_proj.weight.copy_(ref.q_b_proj.weight.narrow(0, rank * query_rows, query_rows))
            self.kv_b_proj.weight.copy_(ref.kv_b_proj.weight.narrow(0, rank * kv_rows, kv_rows))
            columns = self.heads * V_DIM
            self.o_proj.weight.copy_(ref.o_proj.weight.narrow(1, rank * columns, columns))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(self.o_proj(self.attend(x, self.heads)))


def latent_attention_tensor_parallel(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return LatentAttentionTensorParallel(ref, rank, world_size)  # type: ignore[arg-type]


class _FusedAddRMSNorm(nn.Module):
    """vLLM's RMSNorm called with a residual: the residual added to the input first (`x +
    residual`, in that order), the sum returned as the next residual, its norm as the output."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), x


class DeferredResidualLlama(nn.Module):
    """vLLM's LlamaModel: every norm fused with the residual add before it, the attention's and
    the MLP's row-parallel outputs all-reduced, the LM head's vocabulary shards gathered."""

    def __init__(self, ref: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        block = ref.layers["0"]
        self.embed = ref.tok_embeddings
        self.input_norm, self.post_norm = _FusedAddRMSNorm(block.attention_norm), _FusedAddRMSNorm(block.ffn_norm)
        self.final_norm = _FusedAddRMSNorm(ref.norm)

        def rows(w: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(w.chunk(world_size, dim=0)[rank].clone())

        def columns(w: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(w.chunk(world_size, dim=1)[rank].clone())

        attention, mlp = block.attention, block.feed_forward
        self.wq, self.wk, self.wv = rows(attention.wq.weight), rows(attention.wk.weight), rows(attention.wv.weight)
        self.wo = columns(attention.wo.weight)
        self.w1, self.w3, self.w2 = rows(mlp.w1.weight), rows(mlp.w3.weight), columns(mlp.w2.weight)
        self.lm_head = rows(ref.output.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        hidden, residual = self.input_norm(hidden, None)
        s = hidden.shape[:2]
        q, k, v = (F.linear(hidden, w).view(*s, -1, HEAD_DIM) for w in (self.wq, self.wk, self.wv))
        hidden = tensor_model_parallel_all_reduce(F.linear(causal_attention(q, k, v), self.wo))
        hidden, residual = self.post_norm(hidden, residual)
        gated = F.silu(F.linear(hidden, self.w1)) * F.linear(hidden, self.w3)
        hidden = tensor_model_parallel_all_reduce(F.linear(gated, self.w2))
        hidden, _ = self.final_norm(hidden, residual)
        return tensor_model_parallel_all_gather(F.linear(hidden, self.lm_head))


def deferred_residual_llama(ref: nn.Module, rank: int, world_size: int) -> nn.Module:
    return DeferredResidualLlama(ref, rank, world_size)
