"""The sequential references of the localization corpus and their inputs (tiny sizes: each check
verifies in seconds). Module names follow the frameworks whose loaders shard them: Hugging Face
names (q_proj / gate_proj / c_attn), gpt-fast's fused `wqkv`, Phi-3's fused `gate_up_proj`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, SEQ, BATCH, VOCAB = 16, 32, 4, 2, 4, 8, 2, 32
ODD_FFN = 22  # not a multiple of 4: a floor split over 4 ranks drops the last two units
ODD_VOCAB = 30  # not a multiple of 4: a floor split over 4 ranks drops ids 28 and 29
EXPERTS = 4
SOFTCAP = 5.0


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[batch, seq, heads, head_dim] queries, grouped keys and values (each repeated up to the
    query heads on its own) -> [batch, seq, heads * head_dim]."""
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2).flatten(2)


class MLP(nn.Module):
    def __init__(self, ffn: int = FFN) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, ffn)
        self.down = nn.Linear(ffn, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class FusedGatedMLP(nn.Module):
    """Phi-3's MLP: one `gate_up_proj` weight laid out [gate; up], chunked in two in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class GQAAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, HEAD_DIM)  # -1: the heads this rank holds
        k = self.k_proj(x).view(b, s, -1, HEAD_DIM)
        v = self.v_proj(x).view(b, s, -1, HEAD_DIM)
        return self.o_proj(causal_attention(q, k, v))


class FusedQKVAttention(nn.Module):
    """gpt-fast's Attention: one `wqkv` weight laid out [q; k; v] whole."""

    def __init__(self) -> None:
        super().__init__()
        self.wqkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        kv = KV_HEADS * HEAD_DIM
        q, k, v = self.wqkv(x).split([HEADS * HEAD_DIM, kv, kv], dim=-1)
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in (q, k, v))
        return self.wo(causal_attention(q, k, v))


class GPT2Attention(nn.Module):
    """GPT-2's attention: `c_attn` a fused [q; k; v] projection with bias, `c_proj` the output."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM)
        self.c_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, HEAD_DIM) for t in self.c_attn(x).chunk(3, dim=-1))
        return self.c_proj(causal_attention(q, k, v))


class RMSNorm(nn.Module):
    def __init__(self, dim: int = HIDDEN) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class PostNormMLP(MLP):
    """An MLP whose output is normalized (a post-norm block's sublayer, no residual)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(super().forward(x))


class PostLayerNormMLP(MLP):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(super().forward(x))


class ActivatedMLP(MLP):
    """Two activated layers (a projection head): the second activation after `down`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(super().forward(x))


class ClassifierMLP(MLP):
    """An MLP classifier over HIDDEN classes: a softmax over `down`'s output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(super().forward(x), dim=-1)


class SoftcapLMHead(nn.Module):
    """Gemma-2's final logit soft-capping: cap * tanh(logits / cap)."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SOFTCAP * torch.tanh(self.lm_head(x) / SOFTCAP)


class LMHeadSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.lm_head(x), dim=-1)


class NormedUp(nn.Module):
    """A projection up to FFN and an RMSNorm over the FFN width (OLMo-2's full-width q_norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.norm = RMSNorm(FFN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.up(x))


class Pooler(nn.Module):
    """The mean over the sequence, projected (a sentence-embedding head)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.mean(dim=1))


class Embedding(nn.Module):
    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class ScaledEmbedding(Embedding):
    """Gemma's embedding, scaled by the square root of the hidden width."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids) * HIDDEN**0.5


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
            gate = (weights * (chosen == index)).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        return out


class ResidualMLPBlock(nn.Module):
    """x + mlp(norm(x)) with a user's MLP and RMSNorm classes (a plan names them)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class ParallelResidualBlock(nn.Module):
    """GPT-J / Falcon's parallel residual: attention and MLP both read x, their outputs added."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = GQAAttention()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x) + self.mlp(x)


def parallel_residual_block() -> ParallelResidualBlock:
    return ParallelResidualBlock()


def mlp() -> MLP:
    return MLP()


def odd_mlp() -> MLP:
    return MLP(ffn=ODD_FFN)


def gated_mlp() -> GatedMLP:
    return GatedMLP()


def fused_gated_mlp() -> FusedGatedMLP:
    return FusedGatedMLP()


def gqa_attention() -> GQAAttention:
    return GQAAttention()


def fused_qkv_attention() -> FusedQKVAttention:
    return FusedQKVAttention()


def gpt2_attention() -> GPT2Attention:
    return GPT2Attention()


def post_norm_mlp() -> PostNormMLP:
    return PostNormMLP()


def post_layer_norm_mlp() -> PostLayerNormMLP:
    return PostLayerNormMLP()


def activated_mlp() -> ActivatedMLP:
    return ActivatedMLP()


def classifier_mlp() -> ClassifierMLP:
    return ClassifierMLP()


def softcap_lm_head() -> SoftcapLMHead:
    return SoftcapLMHead()


def lm_head_softmax() -> LMHeadSoftmax:
    return LMHeadSoftmax()


def normed_up() -> NormedUp:
    return NormedUp()


def pooler() -> Pooler:
    return Pooler()


def embedding() -> Embedding:
    return Embedding()


def odd_embedding() -> Embedding:
    return Embedding(ODD_VOCAB)


def scaled_embedding() -> ScaledEmbedding:
    return ScaledEmbedding()


def moe() -> MoE:
    return MoE()


def residual_mlp_block() -> ResidualMLPBlock:
    return ResidualMLPBlock()


def tokens() -> tuple[torch.Tensor]:
    return (torch.randn(BATCH, SEQ, HIDDEN),)


def _ids(vocab: int, seed: int) -> torch.Tensor:
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))
    ids.view(-1)[:2] = torch.tensor([0, vocab - 1])  # both ends of the vocabulary
    return ids


def token_ids() -> tuple[torch.Tensor]:
    return (_ids(VOCAB, 0),)


def odd_token_ids() -> tuple[torch.Tensor]:
    return (_ids(ODD_VOCAB, 0),)


def lm_head_z_loss() -> nn.Module:
    from .losses import LMHeadZLoss

    return LMHeadZLoss(VOCAB, HIDDEN)


def lm_head_loss() -> nn.Module:
    from .losses import LMHeadLoss

    return LMHeadLoss(VOCAB, HIDDEN)


def tokens_and_labels() -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states and labels, the first two of each sequence -100 (a prompt the loss ignores)."""
    labels = _ids(VOCAB, 1)
    labels[:, :2] = -100
    return torch.randn(BATCH, SEQ, HIDDEN), labels
