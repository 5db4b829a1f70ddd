"""The sequential references of the frameworks corpus and their inputs (tiny sizes: each check
verifies in seconds). Each reference is written the way the plain model of its framework is
(Hugging Face names for vLLM / SGLang, gpt-fast's fused `wqkv`, Megatron's per-head interleaved
`query_key_value` and sequence-first activations), so the parallel builders can shard it the
way that framework's loader does."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, SEQ, BATCH, VOCAB = 16, 32, 4, 2, 4, 8, 2, 32
ODD_FFN = 22  # ceil division over 3 or 4 ranks leaves the last rank shorter (8, 8, 6 / 6, 6, 6, 4)
ODD_VOCAB = 30  # vLLM pads the LM head's vocabulary up to a multiple of the world size
EXPERTS = 4


class MLP(nn.Module):
    def __init__(self, ffn: int = FFN) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, ffn)
        self.down = nn.Linear(ffn, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class GatedMLP(nn.Module):
    """Llama's SwiGLU block with Hugging Face names (vLLM and SGLang load it as gate_up_proj)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[batch, seq, heads, head_dim] query and grouped key / value heads -> [batch, seq, heads * head_dim]."""
    repeats = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(repeats, dim=2), v.repeat_interleave(repeats, dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2).flatten(2)


class GQAAttention(nn.Module):
    """Grouped-query attention with separate projections (the Hugging Face checkpoint layout)."""

    def __init__(self, kv_heads: int = KV_HEADS, heads: int = HEADS) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, heads * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, kv_heads * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, kv_heads * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(heads * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, HEAD_DIM)
        k = self.k_proj(x).view(b, s, -1, HEAD_DIM)
        v = self.v_proj(x).view(b, s, -1, HEAD_DIM)
        return self.o_proj(causal_attention(q, k, v))


class FusedQKVAttention(nn.Module):
    """gpt-fast's Attention: one `wqkv` weight laid out [q; k; v] whole, split by section sizes
    computed from the head counts it holds as attributes (tensor parallelism rewrites them)."""

    def __init__(self) -> None:
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim, self.dim = HEADS, KV_HEADS, HEAD_DIM, HIDDEN
        self.wqkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        q = q.view(b, s, self.n_head, self.head_dim)
        k = k.view(b, s, self.n_local_heads, self.head_dim)
        v = v.view(b, s, self.n_local_heads, self.head_dim)
        return self.wo(causal_attention(q, k, v))


class MegatronAttention(nn.Module):
    """Megatron's ParallelAttention at one rank: sequence-first activations, the fused
    `query_key_value` interleaved per head ([q_h; k_h; v_h] for each head h), scores scaled by the
    head dim's square root, a causal mask, softmax (in float32 when the input is half precision)."""

    def __init__(self) -> None:
        super().__init__()
        self.query_key_value = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM)
        self.dense = nn.Linear(HEADS * HEAD_DIM, HIDDEN)
        self.norm_factor = math.sqrt(HEAD_DIM)
        self.register_buffer("causal", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        mixed = self.query_key_value(x).view(s, b, -1, 3 * HEAD_DIM)  # -1: the heads this rank holds
        q, k, v = mixed.split(HEAD_DIM, dim=-1)
        scores = torch.einsum("sbhd,tbhd->bhst", q, k) / self.norm_factor
        scores = scores.masked_fill(self.causal, float("-inf"))
        if scores.dtype in (torch.float16, torch.bfloat16):
            scores = scores.float()
        probs = F.softmax(scores, dim=-1).type_as(v)
        context = torch.einsum("bhst,tbhd->sbhd", probs, v).flatten(2)
        return self.dense(context)


class LMHead(nn.Module):
    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.lm_head = nn.Linear(HIDDEN, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(x)


class LMHeadSoftmax(LMHead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.lm_head(x), dim=-1)


class LMHeadLoss(LMHead):
    """The mean next-token cross entropy of the LM head's logits."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class LMHeadTokenLoss(LMHead):
    """Each token's cross entropy, [batch, seq] (the loss before a mask's average), computed on
    flattened logits and viewed back."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = self.lm_head(x)
        losses = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="none")
        return losses.view(targets.shape)


class Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class SequenceParallelBlock(nn.Module):
    """A pre-norm MLP block with a residual, sequence-first as Megatron runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    """Embedding, a residual MLP and a final norm (picotron's model with one MLP layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.mlp = MLP()
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(ids)
        return self.norm(h + self.mlp(h))


class ParallelResidualBlock(nn.Module):
    """GPT-J / Falcon's parallel block: attention and MLP both read the same normed input and
    their outputs are added to the residual together."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.attn = GQAAttention(kv_heads=HEADS)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.attn(h) + self.mlp(h)


class MoE(nn.Module):
    """Top-2 routed experts (softmax over the chosen two), each a small GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = nn.ModuleList(MLP(ffn=8) for _ in range(EXPERTS))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, chosen = self.router(x).topk(2, dim=-1)
        return F.softmax(weights, dim=-1), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            gate = (weights * (chosen == index)).sum(-1, keepdim=True)  # 0 where the token skips it
            out = out + gate * expert(x)
        return out


class SharedExpertMoE(nn.Module):
    """Qwen2-MoE's block: the routed experts plus a shared expert (a SiLU MLP) scaled by a sigmoid
    gate of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.moe = MoE()
        self.shared_up = nn.Linear(HIDDEN, FFN, bias=False)
        self.shared_down = nn.Linear(FFN, HIDDEN, bias=False)
        self.shared_gate = nn.Linear(HIDDEN, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared_down(F.silu(self.shared_up(x)))
        return self.moe(x) + torch.sigmoid(self.shared_gate(x)) * shared


CAPACITY = 8  # slots per expert: every token fits (no drops), so the routing is per token


class CapacityMoE(nn.Module):
    """GShard / DeepSpeed-MoE top-1 routing with a fixed capacity per expert, dispatch and combine as
    dense one-hot tensors (static shapes), the experts as batched weights."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.w1 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, FFN) * 0.1)
        self.w2 = nn.Parameter(torch.randn(EXPERTS, FFN, HIDDEN) * 0.1)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = self.gate(tokens).softmax(-1)
        chosen = F.one_hot(probs.argmax(-1), EXPERTS).to(tokens.dtype)
        slot = (chosen.cumsum(0) - 1) * chosen  # each token's place in its expert's queue
        kept = chosen * (slot < CAPACITY).to(tokens.dtype)
        dispatch = kept[..., None] * F.one_hot(slot.long().clamp(0, CAPACITY - 1), CAPACITY).to(tokens.dtype)
        return dispatch, dispatch * (probs * kept).sum(-1)[:, None, None]  # [tokens, experts, slots]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, HIDDEN)
        dispatch, combine = self.route(tokens)
        grouped = torch.einsum("tec,th->ech", dispatch, tokens)
        out = torch.bmm(F.gelu(torch.bmm(grouped, self.w1)), self.w2)
        return torch.einsum("tec,ech->th", combine, out).view_as(x)


class RMSNorm(nn.Module):
    def __init__(self, width: int = HIDDEN) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class LlamaAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[:2]
        q, k, v = (w(x).view(*s, -1, HEAD_DIM) for w in (self.wq, self.wk, self.wv))  # -1: the rank's heads
        return self.wo(causal_attention(q, k, v))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)
        self.w3 = nn.Linear(HIDDEN, FFN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """torchtitan's TransformerBlock with its module names (wq / wk / wv / wo, w1 / w2 / w3)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = RMSNorm()
        self.attention = LlamaAttention()
        self.ffn_norm = RMSNorm()
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleDict({"0": LlamaBlock()})
        self.norm = RMSNorm()
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(ids)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


class LlamaLoss(Llama):
    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = super().forward(ids)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


def alibi_slopes(heads: int) -> torch.Tensor:
    """BLOOM's ALiBi slopes for a power-of-two number of heads: 2^(-8/heads), its square, ..."""
    first = 2.0 ** (-8.0 / heads)
    return torch.tensor([first ** (h + 1) for h in range(heads)])


class ScoredAttention(nn.Module):
    """Causal multi-head attention with the scores written out (a boolean lower-triangular mask),
    optionally biased by ALiBi (each head's slope times the key's distance back)."""

    def __init__(self, alibi: bool = False) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.alibi = alibi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, HEADS, HEAD_DIM).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        if self.alibi:
            back = torch.arange(s)[None, :] - torch.arange(s)[:, None]
            scores = scores + alibi_slopes(HEADS)[:, None, None] * back
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, s, HEADS * HEAD_DIM))


class TiedLM(nn.Module):
    """An embedding whose table is also the LM head's weight (tied word embeddings)."""

    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.embed_tokens(ids)))


class UntiedLM(nn.Module):
    """An embedding and an LM head of their own, straight after each other."""

    def __init__(self, vocab: int = ODD_VOCAB) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.embed_tokens(ids))


class NormedProjection(nn.Module):
    """A projection normalised over its whole width before the output projection (OLMo2's q_norm,
    an RMSNorm over all heads' queries together)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.q_norm = RMSNorm(FFN)
        self.o_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.q_norm(self.q_proj(x)))


class LayerNormedMLP(MLP):
    """An MLP whose hidden units are layer-normalised before the down projection (NormFormer's
    extra LayerNorm in the feed-forward block)."""

    def __init__(self) -> None:
        super().__init__()
        self.ffn_norm = nn.LayerNorm(FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.ffn_norm(F.gelu(self.up(x))))


def mlp() -> MLP:
    return MLP()


def odd_mlp() -> MLP:
    return MLP(ffn=ODD_FFN)


def gated_mlp() -> GatedMLP:
    return GatedMLP()


def gqa_attention() -> GQAAttention:
    return GQAAttention()


def wide_gqa_attention() -> GQAAttention:
    """8 query heads in 4 groups: two groups per rank at world size 2, one at 4."""
    return GQAAttention(kv_heads=4, heads=8)


def fused_qkv_attention() -> FusedQKVAttention:
    return FusedQKVAttention()


def megatron_attention() -> MegatronAttention:
    return MegatronAttention()


def lm_head() -> LMHead:
    return LMHead(ODD_VOCAB)


def lm_head_softmax() -> LMHeadSoftmax:
    return LMHeadSoftmax()


def lm_head_loss() -> LMHeadLoss:
    return LMHeadLoss()


def lm_head_token_loss() -> LMHeadTokenLoss:
    return LMHeadTokenLoss()


def embedding() -> Embedding:
    return Embedding()


def sequence_parallel_block() -> SequenceParallelBlock:
    return SequenceParallelBlock()


def tiny_lm() -> TinyLM:
    return TinyLM()


def parallel_residual_block() -> ParallelResidualBlock:
    return ParallelResidualBlock()


def moe() -> MoE:
    return MoE()


def shared_expert_moe() -> SharedExpertMoE:
    return SharedExpertMoE()


def capacity_moe() -> CapacityMoE:
    return CapacityMoE()


def llama() -> Llama:
    return Llama()


def llama_loss() -> LlamaLoss:
    return LlamaLoss()


def tokens() -> tuple[torch.Tensor]:
    return (torch.randn(BATCH, SEQ, HIDDEN),)


def sequence_first_tokens() -> tuple[torch.Tensor]:
    return (torch.randn(SEQ, BATCH, HIDDEN),)


def _ids(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))
    ids.view(-1)[:2] = torch.tensor([0, VOCAB - 1])  # both ends of the vocabulary, each shard's bound
    return ids


def token_ids() -> tuple[torch.Tensor]:
    return (_ids((BATCH, SEQ), 0),)


def tokens_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(BATCH, SEQ, HIDDEN), _ids((BATCH, SEQ), 1)


def four_sequences_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of four sequences (a block of whole sequences for each of up to four ranks)."""
    return torch.randn(4, SEQ, HIDDEN), _ids((4, SEQ), 1)


def tokens_and_masked_targets() -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face-style labels: the first tokens of each sequence (a prompt) and the last of the
    second (padding) are -100, which the loss ignores."""
    targets = _ids((BATCH, SEQ), 1)
    targets[:, :2] = -100
    targets[1, -3:] = -100
    return torch.randn(BATCH, SEQ, HIDDEN), targets


def ids_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    return _ids((BATCH, SEQ), 0), _ids((BATCH, SEQ), 1)


def scored_attention() -> ScoredAttention:
    return ScoredAttention()


def alibi_attention() -> ScoredAttention:
    return ScoredAttention(alibi=True)


def tied_lm() -> TiedLM:
    return TiedLM()


def odd_vocab_lm() -> UntiedLM:
    return UntiedLM()


def odd_token_ids() -> tuple[torch.Tensor]:
    ids = torch.randint(0, ODD_VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    ids.view(-1)[:2] = torch.tensor([0, ODD_VOCAB - 1])
    return (ids,)


def normed_projection() -> NormedProjection:
    return NormedProjection()


def layer_normed_mlp() -> LayerNormedMLP:
    return LayerNormedMLP()
