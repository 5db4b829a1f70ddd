"""Tiny Hugging Face models (transformers 5.x) and their tensor-parallel versions.

The reference is the model as `from_config` builds it; the parallel version is the same model
distributed the way `from_pretrained(..., distributed_config=DistributedConfig(tp_size=N))`
distributes it: `maybe_distribute_model` applies the model's built-in `tp_plan` (q/k/v and
gate/up column-wise, o and down row-wise, the embedding split along the vocabulary, the LM head
column-wise with its output gathered). `PLAN_OVERRIDES` is the place to change plan entries.

Phi-3 packs the gate and up projections into one `gate_up_proj` and splits its output with
`chunk(2)`. Its built-in plan gathers that output on every rank; `PHI3_PLAN_OVERRIDES` keeps it
sharded instead, with `packed_colwise` (each rank holds its part of the gate rows and of the up
rows) and a row-wise `down_proj`: no gather in the MLP.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, PreTrainedModel
from transformers.distributed import DistributedConfig
from transformers.distributed.utils import initialize_distributed_mesh

# Entries merged over the model's own plan (module pattern -> style name).
PLAN_OVERRIDES: dict[str, str] = {
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.down_proj": "rowwise",
}


PHI3_PLAN_OVERRIDES: dict[str, str] = {
    "model.layers.*.mlp.gate_up_proj": "packed_colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
}


# Small enough for CI: 8 query heads over 4 key-value heads, so world sizes 2 and 4 split both.
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def tiny_config(layers: int = 2) -> LlamaConfig:
    return LlamaConfig(num_hidden_layers=layers, **TINY)


def tiny_phi3_config(layers: int = 2) -> Phi3Config:
    # token ids inside the small vocabulary (Phi-3's defaults are 32000-based)
    return Phi3Config(num_hidden_layers=layers, pad_token_id=0, bos_token_id=1, eos_token_id=2, **TINY)


class Logits(nn.Module):
    """The causal LM's logits for a batch of token ids (no cache)."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build() -> Logits:
    return Logits(LlamaForCausalLM(tiny_config()).eval())


def build_quick() -> Logits:
    return Logits(LlamaForCausalLM(tiny_config(layers=1)).eval())


def build_phi3() -> Logits:
    return Logits(Phi3ForCausalLM(tiny_phi3_config()).eval())


def build_phi3_quick() -> Logits:
    return Logits(Phi3ForCausalLM(tiny_phi3_config(layers=1)).eval())


def distribute(reference: Logits, world_size: int, overrides: dict[str, str]) -> Logits:
    """What `from_pretrained(..., distributed_config=...)` does to the model before loading weights."""
    config = DistributedConfig(tp_size=world_size, tp_plan=overrides)
    _, mesh_manager = initialize_distributed_mesh(config)
    model = type(reference.model).maybe_distribute_model(reference.model, config, mesh_manager)
    return Logits(model.eval())


def tensor_parallel(reference: Logits, rank: int, world_size: int) -> Logits:
    del rank  # the mesh knows it
    return distribute(reference, world_size, PLAN_OVERRIDES)


def tensor_parallel_phi3(reference: Logits, rank: int, world_size: int) -> Logits:
    del rank
    return distribute(reference, world_size, PHI3_PLAN_OVERRIDES)


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, 256, (2, 16), generator=generator),)
