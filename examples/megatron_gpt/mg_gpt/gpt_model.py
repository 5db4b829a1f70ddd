"""Megatron-core's own GPTModel (the local, pure-PyTorch layer spec) with tensor parallelism; the
same code at world size 1 is the reference.

This is the model Megatron's pretraining script builds: rotary embeddings, RMSNorm, fused QKV
attention over sharded heads, a gated MLP, a vocabulary-parallel embedding and output layer.
`parallel_output=False` gathers the vocabulary-parallel logits, so every rank returns them whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import nn

VOCAB_SIZE = 256
MAX_SEQUENCE_LENGTH = 32


class Generate(nn.Module):
    """What a generation loop calls: token ids in, logits out (positions 0..seq-1)."""

    def __init__(self, model: GPTModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
        return self.model(tokens, positions, None)


def build() -> Generate:
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        gated_linear_unit=True,
        normalization="RMSNorm",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=dist.get_world_size(),
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
    )
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=VOCAB_SIZE,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        position_embedding_type="rope",
        parallel_output=False,
    )
    return Generate(model)


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, VOCAB_SIZE, (2, 16), generator=generator),)
