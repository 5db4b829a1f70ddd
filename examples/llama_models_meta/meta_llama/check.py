"""Meta's Llama 3 `Transformer` from llama-models, unchanged, at a small size.

llama-models writes one model on fairscale's model-parallel layers; world size 1 is its
sequential reference. The model's forward takes the tokens and the position of the first one
in its KV cache (`start_pos`); the check runs a whole prompt from position 0, the prefill step
of generation, which writes the prompt's keys and values into the cache and attends over them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fairscale.nn.model_parallel.mappings import reduce_from_model_parallel_region  # noqa: F401 - see bug variants
from llama_models.llama3.args import ModelArgs
from llama_models.llama3.model import Attention, Transformer, apply_rotary_emb, repeat_kv
from torch import nn

BATCH, PROMPT = 2, 16


def model_args(n_layers: int = 2, use_scaled_rope: bool = True) -> ModelArgs:
    return ModelArgs(
        dim=128,
        n_layers=n_layers,
        n_heads=8,
        n_kv_heads=4,
        vocab_size=512,
        multiple_of=64,
        rope_theta=500000.0,
        use_scaled_rope=use_scaled_rope,
        max_batch_size=BATCH,
        max_seq_len=PROMPT,
    )


class Prefill(nn.Module):
    """One prefill step: logits for a prompt that starts at cache position 0."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, 0)


class SdpaAttention(Attention):
    """Meta's attention with the score computation replaced by `scaled_dot_product_attention`, a
    common local change; the projections, rotary embedding and KV cache are Meta's."""

    def forward(
        self, x: torch.Tensor, start_pos: int, freqs_cis: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        self.cache_k = self.cache_k.to(xq)
        self.cache_v = self.cache_v.to(xq)
        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
        keys = repeat_kv(self.cache_k[:bsz, : start_pos + seqlen], self.n_rep)
        values = repeat_kv(self.cache_v[:bsz, : start_pos + seqlen], self.n_rep)
        output = F.scaled_dot_product_attention(
            xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask
        )
        output = output.transpose(1, 2).reshape(bsz, seqlen, -1)
        return self.wo(output)


def with_sdpa_attention(model: Transformer) -> Transformer:
    for block in model.layers:
        block.attention.__class__ = SdpaAttention
    return model


def build() -> Prefill:
    return Prefill(Transformer(model_args()))


def build_quick() -> Prefill:
    return Prefill(Transformer(model_args(n_layers=1)))


def build_sdpa() -> Prefill:
    return Prefill(with_sdpa_attention(Transformer(model_args())))


def build_sdpa_quick() -> Prefill:
    return Prefill(with_sdpa_attention(Transformer(model_args(n_layers=1))))


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, 512, (BATCH, PROMPT), generator=generator),)
