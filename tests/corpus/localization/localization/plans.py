"""DTensor tensor-parallel plans (family `plan`): torchtitan-style plans of ParallelStyle objects
and Hugging Face transformers-style `tp_plan` dicts of style names, over
init_device_mesh("cpu", (world_size,)). The line to change is the plan entry."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleOutput,
    RowwiseParallel,
    parallelize_module,
)

# transformers' style names (integrations/tensor_parallel.py) mapped to DTensor styles
STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise": lambda: RowwiseParallel(),
}


def _apply_tp_plan(model: nn.Module, world_size: int, tp_plan: dict[str, str]) -> nn.Module:
    mesh = init_device_mesh("cpu", (world_size,))
    return parallelize_module(model, mesh, {name: STYLES[style]() for name, style in tp_plan.items()})


def attention_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """torchtitan apply_tp on an attention block: q / k / v colwise by heads, o rowwise."""
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {
        "q_proj": ColwiseParallel(),
        "k_proj": ColwiseParallel(output_layouts=Replicate()),
        "v_proj": ColwiseParallel(),
        "o_proj": RowwiseParallel(),
    }
    return parallelize_module(model, mesh, plan)


def lm_head_tp_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """transformers' base_model_tp_plan for an LM head followed by a softmax over the vocabulary."""
    del rank
    tp_plan = {
        "lm_head": "colwise",
    }
    return _apply_tp_plan(model, world_size, tp_plan)


def attention_tp_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """transformers' tp_plan for a GQA attention layer."""
    del rank
    tp_plan = {
        "q_proj": "colwise",
        "k_proj": "colwise_rep",
        "v_proj": "colwise",
        "o_proj": "rowwise",
    }
    return _apply_tp_plan(model, world_size, tp_plan)


def mlp_class_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """A residual block whose user MLP class defers its reduction to its own boundary: down_proj
    leaves Partial sums, the MLP module's output is declared Partial and redistributed to
    Replicate (torchtitan's MoE pattern, PrepareModuleOutput on the module)."""
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=Partial()),
        "mlp": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate()),
    }
    return parallelize_module(model, mesh, plan)


def row_partial_plan(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """An MLP plan whose row-parallel entry leaves its sums Partial (no module reduces them)."""
    del rank
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {
        "up": ColwiseParallel(),
        "down": RowwiseParallel(output_layouts=Partial()),
    }
    return parallelize_module(model, mesh, plan)
