"""The sequential reference: a tiny Hugging Face Llama (transformers 5.x) built from its config.

The MLP has biases (`mlp_bias=True`) so that the row-parallel `down_proj` has one: DeepSpeed's
`LinearAllreduce` adds it once, after the all-reduce.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

# 8 query heads over 4 key-value heads: world sizes 2 and 4 split both evenly.
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "mlp_bias": True,
}


def tiny_config(layers: int = 2) -> LlamaConfig:
    return LlamaConfig(num_hidden_layers=layers, **TINY)


class Logits(nn.Module):
    """The causal LM's logits for a batch of token ids (no cache)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build() -> Logits:
    return Logits(LlamaForCausalLM(tiny_config()).eval())


def build_quick() -> Logits:
    return Logits(LlamaForCausalLM(tiny_config(layers=1)).eval())


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, 256, (2, 16), generator=generator),)
