"""DeepSpeed AutoTP (training mode) applied to the tiny Llama, as `deepspeed.initialize` applies it.

A training script writes

    ds_config = {"tensor_parallel": {"autotp_size": N, "partition_config": PARTITION_CONFIG}, ...}
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)

and the engine shards the model first (`DeepSpeedEngine._apply_autotp_partitioning`): AutoTP
replaces every `nn.Linear` a layer spec matches by a `LinearLayer` (column-parallel: q/k/v,
gate/up, and the LM head with `gather_output`) or a `LinearAllreduce` (row-parallel: o_proj,
down_proj, all-reduced in the forward; the bias added once, after it). `autotp` below runs
exactly that step of the engine, with DeepSpeed's own config classes, without the rest of the
engine (optimizer, ZeRO, the data-loader consistency hook).

`autotp_float32_reduce` shards the MLP's `down_proj` by hand instead, with a subclass of
`LinearAllreduce` that sums the ranks' partial sums in float32 (half-precision training loses
bits in that sum); AutoTP shards the rest, its spec for `down_proj` set to `skip`.

Two adaptations make AutoTP run outside the engine, both here rather than in shardproof:

- `deepspeed.comm` is pointed at the `torch.distributed` process group that is already set up
  (`init_distributed` does exactly that when torch.distributed is initialised), with DeepSpeed's
  shared-memory CPU all-reduce kernel left unbuilt: on a CPU machine `init_distributed` would
  otherwise compile it (minutes, and a C++ toolchain) and attach it to the process group.
- The tensor-parallel group is this rank's whole process group, given to AutoTP directly. The
  engine puts it in `deepspeed.utils.groups` (a device mesh of data-parallel size 1); that
  module global is shared by every thread of a process, and shardproof's numeric witness runs
  the ranks of a plain-model check as threads of one process.
"""

from __future__ import annotations

import threading
from typing import Any

import deepspeed
import deepspeed.comm as ds_comm
import torch
import torch.distributed as dist
from deepspeed.module_inject.auto_tp import AutoTP
from deepspeed.module_inject.layers import LinearAllreduce, RowParallel, add_bias, set_autotp_mode
from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig

from .model import Logits

# The user's AutoTP policy: DeepSpeed's `tensor_parallel.partition_config` (regular expressions
# over parameter names; the first spec that matches decides).
COLUMN_SPECS = [
    {"patterns": [r".*\.self_attn\.[qkv]_proj\.weight$"], "partition_type": "column"},
    {"patterns": [r".*\.mlp\.(gate|up)_proj\.weight$"], "partition_type": "column"},
    {"patterns": [r".*lm_head\.weight$"], "partition_type": "column", "gather_output": True},
]
ROW_SPECS = [
    {"patterns": [r".*\.self_attn\.o_proj\.weight$"], "partition_type": "row"},
]
DOWN_PROJ_ROW = {"patterns": [r".*\.mlp\.down_proj\.weight$"], "partition_type": "row"}
DOWN_PROJ_BY_HAND = {"patterns": [r".*\.mlp\.down_proj\.weight$"], "partition_type": "skip"}

PARTITION_CONFIG = {"use_default_specs": False, "layer_specs": [*COLUMN_SPECS, *ROW_SPECS, DOWN_PROJ_ROW]}
PARTITION_CONFIG_DOWN_BY_HAND = {
    "use_default_specs": False,
    "layer_specs": [*COLUMN_SPECS, *ROW_SPECS, DOWN_PROJ_BY_HAND],
}

_SHM_KERNEL = "deepspeed_shm_comm"
_comm_lock = threading.Lock()


def use_torch_distributed() -> None:
    """`deepspeed.comm` on the torch.distributed process group already initialised (see above)."""
    with _comm_lock:
        if ds_comm.is_initialized():
            return
        compatible = deepspeed.ops.__compatible_ops__
        saved = compatible.get(_SHM_KERNEL)
        compatible[_SHM_KERNEL] = False  # build_shm_op() skips an incompatible kernel
        try:
            ds_comm.init_distributed(verbose=False)
        finally:
            if saved is None:
                compatible.pop(_SHM_KERNEL, None)
            else:
                compatible[_SHM_KERNEL] = saved


def apply_autotp(model: torch.nn.Module, world_size: int, partition_config: dict[str, Any]) -> torch.nn.Module:
    """The AutoTP step of `deepspeed.initialize` with `tensor_parallel.partition_config`."""
    use_torch_distributed()
    set_autotp_mode(training=True)  # what deepspeed.initialize does for `tensor_parallel` configs
    tp_config = TPTrainingConfig(autotp_size=world_size, partition_config=partition_config)
    autotp = AutoTP(
        module=model,
        all_reduce_linears=(),
        prefix="",
        state_dict=None,
        linear_layer_setting=(torch.nn.Linear, torch.nn.Embedding),
        orig_layer_impl=None,
        keep_module_on_host=tp_config.keep_module_on_host,
        partition_config=tp_config.get_partition_config_object(),
        model_config=getattr(model, "config", None),
        tp_grain_size=tp_config.tensor_parallel.tp_grain_size,
        training_mode=True,
    )
    # set_tensor_parallel_config() reads the group from deepspeed.utils.groups in training mode
    autotp.mp_group = dist.group.WORLD
    autotp.mp_size = world_size
    autotp.update_linear_policies()
    autotp._replace_module(model)
    model.ds_autotp_parsed = True
    return model


def autotp(reference: Logits, rank: int, world_size: int) -> Logits:
    del rank  # DeepSpeed's layers ask the process group
    apply_autotp(reference.model, world_size, PARTITION_CONFIG)
    return reference


def upcast(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class Float32LinearAllreduce(LinearAllreduce):
    """DeepSpeed's row-parallel linear, its partial sums all-reduced in float32."""

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        summed = RowParallel.apply(self.mp_group, upcast(partial), not self.is_training_mode())
        return summed.to(partial.dtype)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        partial = torch.matmul(input, self.weight.transpose(-1, -2))
        return add_bias(self.all_reduce(partial), self.bias)


def autotp_float32_reduce(reference: Logits, rank: int, world_size: int) -> Logits:
    del rank
    model = apply_autotp(reference.model, world_size, PARTITION_CONFIG_DOWN_BY_HAND)
    for index, layer in enumerate(model.model.layers):
        name = f"model.layers.{index}.mlp.down_proj"
        layer.mlp.down_proj = Float32LinearAllreduce(layer.mlp.down_proj, dist.group.WORLD, name=name)
    return reference
