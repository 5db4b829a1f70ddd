"""Tiny versions of every transformers model whose config has a built-in tensor-parallel plan.

`shrink` scales a default config down by attribute name alone (sizes, heads, experts, layers,
layer-indexed lists), so that a new model family usually needs nothing; `FAMILY_OVERRIDES` holds
the few settings the generic rules cannot guess. `check_functions(name)` gives the three
functions a shardproof check needs (reference builder, parallel builder, example inputs) for one
config class, and `distribute` applies the model's own plan the way
`from_pretrained(..., distributed_config=DistributedConfig(tp_size=N))` does.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from functools import cache

import torch
from torch import nn

HIDDEN = 64
HEADS = 8
KV_HEADS = 4
HEAD_DIM = HIDDEN // HEADS
VOCAB = 256
POSITIONS = 64
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
BATCH, SEQUENCE = 2, 8
# Special token ids are moved to the top of the vocabulary and example ids stay below them, so
# no example token is mistaken for an image or audio placeholder.
HIGHEST_EXAMPLE_ID = 200

# Settings the generic rules cannot guess, by config class; keep this small and say why.
FAMILY_OVERRIDES: dict[str, dict[str, object]] = {
    # its default `layer_types` is None and the model indexes it: one short-convolution layer and
    # one attention layer
    "Lfm2MoeConfig": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]},
}


def _heads(name: str, value: int, _scale: float) -> int:
    # key-value heads: 4 where the model groups queries (GQA), one where it shares one (MQA);
    # `_multi_head` keeps as many as the query heads where the default has as many (MHA, MLA)
    if re.search(r"(kv|key_value|key)_heads|num_kv", name):
        return KV_HEADS if value > 1 else value
    return HEADS


def _multi_head(config) -> dict[str, int]:
    kv, heads = getattr(config, "num_key_value_heads", None), getattr(config, "num_attention_heads", None)
    return {"num_key_value_heads": HEADS} if isinstance(kv, int) and kv == heads else {}


def _head_dim(_name: str, value: int, scale: float) -> int:
    # every per-head size scales by the same factor, so sums such as DeepSeek's
    # qk_head_dim = qk_nope_head_dim + qk_rope_head_dim still hold; rotary halves need even sizes
    return max(2, 2 * round(value * scale / 2))


def _intermediate(name: str, value: int, _scale: float) -> int:
    expert_sized = any(word in name for word in ("moe", "expert", "shared"))
    return min(value, 32 if expert_sized else 2 * HIDDEN)


def _at_most(target: int) -> Callable[[str, int, float], int]:
    return lambda _name, value, _scale: min(value, target) if value > 0 else value


def _set(target: int) -> Callable[[str, int, float], int]:
    return lambda _name, _value, _scale: target


# (pattern over the attribute name, new value from the name, the old value and the head-size
# scale); the first match wins. Attributes matching none keep their default.
GENERIC_RULES: list[tuple[str, Callable[[str, int, float], int]]] = [
    (r"^(num_hidden_layers|num_layers)$", _set(1)),
    (r"vocab_size", _at_most(VOCAB)),
    (r"max_position_embeddings|^model_max_length$", _at_most(POSITIONS)),
    (r"^(hidden_size|d_model|embedding_dim|out_hidden_size)$", _at_most(HIDDEN)),
    (r"intermediate|ffn_hidden_size|moe_hidden_size|expert_dim", _intermediate),
    # routing: 4 experts, top-2, one shared expert, one group
    (r"experts_per_tok|^(moe_k|moe_topk|top_k|num_selected_experts)$", _at_most(EXPERTS_PER_TOKEN)),
    (r"shared_experts?$|^n_shared_experts$", _at_most(1)),
    (r"^(n_group|num_expert_group|topk_group|n_groups)$", _at_most(1)),
    (r"(^|_)experts$|^num_local_experts$|^n_routed_experts$|^moe_num_experts$", _at_most(EXPERTS)),
    (r"^zero_expert_num$", _at_most(2)),
    # the first layer is the mixture of experts, not the dense prefix
    (r"^(first_k_dense_replace|num_dense_layers|moe_layer_start_index|expert_layer_offset)$", _set(0)),
    (r"^(decoder_sparse_step|moe_layer_interval|interleave_moe_layer_step|expert_layer_period)$", _set(1)),
    (r"^moe_layer_end_index$", _set(0)),
    # layers that a small model does not have
    (r"^(num_nextn_predict_layers|num_kv_shared_layers)$", _set(0)),
    (r"head_dim$|^d_head$|_d_head$", _head_dim),
    (r"heads$", _heads),
    (r"lora_rank$|_rank$", _at_most(16)),
    (r"sliding_window|attention_chunk_size|^window_size$", _at_most(32)),
    (r"^index_topk$", _at_most(16)),
    (r"d_state$|state_size$|chunk_size$", _at_most(16)),
    (r"hidden_size_per_layer_input", _at_most(16)),
]

# Defaults of None that the modeling code uses as numbers (most configs fill them in after
# init, a few leave it to the model): what None stands for at the tiny size.
NONE_DEFAULTS = {
    "head_dim": HEAD_DIM,
    "num_key_value_heads": HEADS,
    "n_routed_experts": EXPERTS,
    "num_experts_per_tok": EXPERTS_PER_TOKEN,
    "n_shared_experts": 1,
    "sliding_window": 32,
}

SPECIAL_ID = re.compile(r"(_token_id|_token_index|_id)$")
NOT_SIZES = {"pretraining_tp", "chunk_size_feed_forward", "seed"}


def _head_scale(config) -> float:
    """The factor that takes the model's head size to HEAD_DIM."""
    head_dim = vars(config).get("head_dim")  # per-layer head sizes raise on a global read
    if not isinstance(head_dim, int) or head_dim <= 0:
        hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
        head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else HEAD_DIM
    return HEAD_DIM / head_dim


def _shrink_value(name: str, value: int, scale: float) -> int | None:
    if name in NOT_SIZES:
        return None
    for pattern, rule in GENERIC_RULES:
        if re.search(pattern, name):
            return rule(name, value, scale)
    return None


def _layer_selection(config, layers: int, every_kind: bool) -> list[int]:
    """The first layer of each kind the model has, in order: the fewest layers that still run
    every attention or mixer kind (a hybrid model's linear attention and its full attention)."""
    kinds = getattr(config, "layer_types", None)
    if getattr(config, "per_layer_attributes", None):
        return [0]  # head sizes that differ by layer kind: reading them globally raises
    if not every_kind or not isinstance(kinds, list | tuple) or len(kinds) != layers:
        return [0]
    first: dict[str, int] = {}
    for index, kind in enumerate(kinds):
        first.setdefault(str(kind), index)
    return sorted(first.values())


def _is_index_list(name: str, value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and re.search(r"(_layers|layer_ids)$", name) is not None
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    )


def shrink(config, every_kind: bool = True) -> dict[str, object]:
    """Keyword arguments that rebuild `config` (a default instance) at a tiny size: one layer of
    each layer kind (`every_kind`), else one layer."""
    from transformers import PretrainedConfig

    overrides: dict[str, object] = {}
    scale = _head_scale(config)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", None)
    kept = _layer_selection(config, layers, every_kind) if isinstance(layers, int) else [0]
    next_free_id = VOCAB - 1
    for name, value in sorted(vars(config).items()):
        if name.startswith("_") or isinstance(value, bool):
            continue
        if value is None and name in NONE_DEFAULTS:
            overrides[name] = NONE_DEFAULTS[name]
        elif isinstance(value, PretrainedConfig):
            overrides[name] = shrink(value, every_kind)
        elif isinstance(value, int) and SPECIAL_ID.search(name):
            if value >= HIGHEST_EXAMPLE_ID:
                overrides[name], next_free_id = next_free_id, next_free_id - 1
        elif isinstance(value, int):
            new = _shrink_value(name, value, scale)
            if new is not None and new != value:
                overrides[name] = new
        elif isinstance(value, list | tuple) and isinstance(layers, int) and layers > 1 and len(value) == layers:
            overrides[name] = [value[i] for i in kept]  # one entry per layer
        elif _is_index_list(name, value):
            overrides[name] = [kept.index(i) for i in value if i in kept]  # layer indices
        elif name == "rope_parameters" and isinstance(value, dict) and "rope_type" in value and _uses_mrope(config):
            # multimodal rotary sections must add up to half the rotated part of the new head
            rotated = int(HEAD_DIM * value.get("partial_rotary_factor", 1.0))
            sections = value.get("mrope_section") or QWEN2_VL_MROPE_SECTIONS
            overrides[name] = {**value, "mrope_section": _split(rotated // 2, sections)}
    if isinstance(layers, int) and len(kept) > 1:
        overrides["num_hidden_layers" if hasattr(config, "num_hidden_layers") else "num_layers"] = len(kept)
    overrides.update(_consistent_state_space(config, overrides))
    overrides.update(_multi_head(config))
    if hasattr(config, "tie_word_embeddings"):
        overrides["tie_word_embeddings"] = False
    overrides.update(FAMILY_OVERRIDES.get(type(config).__name__, {}))
    return overrides


# Qwen2-VL's default split of the rotary frequencies (time, height, width), which the models
# that take M-RoPE from it assume when their config names none
QWEN2_VL_MROPE_SECTIONS = [16, 24, 24]


def _uses_mrope(config) -> bool:
    try:
        module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    except ImportError:
        return False  # a config whose model lives in another family's module
    return "mrope_section" in inspect.getsource(module)


def _split(total: int, sections: list[int]) -> list[int]:
    """`total` split in proportion to `sections` (largest remainders)."""
    whole = sum(sections)
    exact = [total * s / whole for s in sections]
    parts = [int(e) for e in exact]
    by_remainder = sorted(range(len(sections)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    for i in by_remainder[: max(0, total - sum(parts))]:
        parts[i] += 1
    return parts


def _consistent_state_space(config, overrides: dict[str, object]) -> dict[str, object]:
    """Mamba-2 mixers need heads x head size = expand x hidden size."""
    for heads, head_dim in (("mamba_n_heads", "mamba_d_head"), ("mamba_num_heads", "mamba_head_dim")):
        if hasattr(config, heads) and isinstance(getattr(config, head_dim, None), int):
            expand = overrides.get("mamba_expand", getattr(config, "mamba_expand", 2))
            hidden = overrides.get("hidden_size", HIDDEN)
            dim = overrides.get(head_dim, getattr(config, head_dim))
            return {heads: max(1, int(expand * hidden) // dim)}
    return {}


@cache
def config_class(name: str):
    """The config class called `name`, importing only its own module."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    for model_type, class_name in CONFIG_MAPPING_NAMES.items():
        if class_name == name:
            return CONFIG_MAPPING[model_type]
    raise KeyError(f"no transformers config class named {name}")


def zoo_names() -> list[str]:
    """Every config class whose default instance has a non-empty `base_model_tp_plan`."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    transformers.logging.set_verbosity_error()
    names = set()
    for model_type in CONFIG_MAPPING:
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # noqa: BLE001 - a config that fails with its defaults has no default plan either
            continue
        if getattr(config, "base_model_tp_plan", None):
            names.add(type(config).__name__)
    return sorted(names)


def tiny_config(name: str, every_kind: bool = True):
    cls = config_class(name)
    overrides = shrink(cls(), every_kind)
    try:
        return cls(**overrides)
    except ValueError as exc:
        # a few architectures refuse grouped-query attention: as many key-value heads as heads
        if "key_value_heads" not in str(exc) or "num_key_value_heads" not in overrides:
            raise
        return cls(**{**overrides, "num_key_value_heads": overrides.get("num_attention_heads", HEADS)})


def model_class(config) -> tuple[type, bool]:
    """The causal LM class for the config (True), else its base model (False). A sub-config of a
    multimodal model (its text tower) is in no auto mapping: then the class of its own family's
    modeling module that declares it as its `config_class`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

    for mapping, causal_lm in ((MODEL_FOR_CAUSAL_LM_MAPPING, True), (MODEL_MAPPING, False)):
        try:
            return mapping[type(config)], causal_lm
        except KeyError:
            continue
    family = type(config).__module__.rsplit(".", 1)[0]
    module = importlib.import_module(family + ".modeling_" + family.rsplit(".", 1)[1])
    candidates = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, nn.Module)
        and getattr(value, "config_class", None) is type(config)
        and value.forward is not nn.Module.forward
    ]
    for suffix, causal_lm in (("ForCausalLM", True), ("Model", False)):
        for candidate in candidates:
            if candidate.__name__.endswith(suffix):
                return candidate, causal_lm
    raise KeyError(f"no model class for {type(config).__name__}")


def is_moe(config) -> bool:
    return any("experts" in name and value for name, value in vars(config).items() if isinstance(value, int))


class Forward(nn.Module):
    """Logits (causal LM) or the last hidden state (base model) for a batch of token ids."""

    def __init__(self, model: nn.Module, causal_lm: bool) -> None:
        super().__init__()
        self.model = model
        self.causal_lm = causal_lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        output = self.model(input_ids=input_ids, use_cache=False)
        logits = getattr(output, "logits", None) if self.causal_lm else None
        return logits if logits is not None else output[0]


def build(name: str) -> Forward:
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        config = tiny_config(name)
        cls, causal_lm = model_class(config)
        return Forward(cls(config).eval(), causal_lm)
    except (ValueError, TypeError, AttributeError, RuntimeError):
        # a model whose code assumes every layer alike (one head size for all): one layer only
        config = tiny_config(name, every_kind=False)
        cls, causal_lm = model_class(config)
        return Forward(cls(config).eval(), causal_lm)


def distribute(reference: Forward, world_size: int) -> Forward:
    """What `from_pretrained(..., tp_plan="auto")` does to the model before loading weights."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    config = DistributedConfig(tp_size=world_size)
    _, mesh = initialize_distributed_mesh(config)
    model = type(reference.model).maybe_distribute_model(reference.model, config, mesh)
    return Forward(model.eval(), reference.causal_lm)


def example_inputs() -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, HIGHEST_EXAMPLE_ID, (BATCH, SEQUENCE), generator=generator),)


def check_functions(name: str) -> tuple[Callable[[], Forward], Callable[..., Forward], Callable[[], tuple]]:
    """The reference builder, parallel builder and example inputs of the check for `name`."""

    def reference() -> Forward:
        return build(name)

    def tensor_parallel(model: Forward, rank: int, world_size: int) -> Forward:
        del rank  # the mesh knows it
        return distribute(model, world_size)

    return reference, tensor_parallel, example_inputs
