"""Model-parallel libraries whose global state shardproof sets up for every captured rank.

fairscale and Megatron-core keep their model-parallel groups in module globals, which a
training script fills once (`initialize_model_parallel`) before it builds the model. shardproof
plays that script: for every rank it captures (and for the one-rank reference of the "same code
at world size 1" pattern) it initialises each of these libraries that the user's code imported,
with every rank of the fake process group in one tensor-parallel group, and clears them again
afterwards. Initialisation runs outside the meta device, because the libraries compute their
group layout with real tensors.

A builder may initialise the library itself, but must skip that when it is already initialised
(`model_parallel_is_initialized()`), as a script that is imported twice would.

Megatron-core needs three shims to run on a CPU-only machine, all applied here while a rank is
captured and undone afterwards (measured with megatron-core 0.16.1):
- `initialize_model_parallel(..., create_gloo_process_groups=False)`: the fake process group
  has no gloo side groups;
- `ModelParallelConfig.use_cpu_initialization = True`: otherwise the layers allocate their
  weights with `device=torch.cuda.current_device()`;
- `torch.cuda.current_device()` returns the meta device (the CPU when the numeric witness runs
  real ranks): sequence-parallel layers allocate their all-gather buffers on it, and on CPU-only
  torch it raises.
Three more are needed for `GPTModel`: its attention forks Megatron's CUDA RNG tracker, replaced
by a null tracker (`_NullRNGTracker`); the softmax's default causal mask (made when the caller
passes no attention mask) is built on the same device instead of a hard-coded "cuda"; and
`make_viewless_tensor` keeps the view (see `_keep_view`).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any


def _fairscale_initialise(world_size: int) -> None:
    initialize = sys.modules.get("fairscale.nn.model_parallel.initialize")
    if initialize is None or initialize.model_parallel_is_initialized():
        return
    # fairscale announces its groups on stdout, which belongs to the CLI's report
    with contextlib.redirect_stdout(io.StringIO()):
        initialize.initialize_model_parallel(world_size)


def _megatron_initialise(world_size: int) -> None:
    state = sys.modules.get("megatron.core.parallel_state")
    if state is None or state.model_parallel_is_initialized():
        return
    state.initialize_model_parallel(tensor_model_parallel_size=world_size, create_gloo_process_groups=False)


def initialise_libraries(world_size: int) -> None:
    """Set up the model-parallel state of the libraries the user's code imported."""
    _fairscale_initialise(world_size)
    _megatron_initialise(world_size)


@contextlib.contextmanager
def library_shims(device: str = "meta") -> Iterator[None]:
    """Megatron-core's CPU shims (see the module docstring), only if the user's code imported it.
    `device` is where Megatron's buffers go: meta while capturing, cpu for real numbers."""
    config_module = sys.modules.get("megatron.core.model_parallel_config")
    if config_module is None:
        yield
        return
    import torch

    config_class = config_module.ModelParallelConfig
    original_post_init = config_class.__post_init__
    original_device = torch.cuda.current_device

    def cpu_post_init(self: object) -> None:
        self.use_cpu_initialization = True  # type: ignore[attr-defined]
        original_post_init(self)

    config_class.__post_init__ = cpu_post_init
    torch.cuda.current_device = lambda: torch.device(device)  # type: ignore[assignment]
    softmax = sys.modules.get("megatron.core.fusions.fused_softmax")
    original_mask = getattr(softmax, "get_default_causal_mask", None)
    if softmax is not None and original_mask is not None:
        softmax.get_default_causal_mask = _causal_mask_on(device)  # type: ignore[attr-defined]
    random = sys.modules.get("megatron.core.tensor_parallel.random")
    original_tracker = getattr(random, "_CUDA_RNG_STATE_TRACKER", None)
    original_initialized = getattr(random, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", False)
    if random is not None:
        random._CUDA_RNG_STATE_TRACKER = _NullRNGTracker()  # type: ignore[attr-defined]
        random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True  # type: ignore[attr-defined]
    viewless = _replace_everywhere("megatron.", "make_viewless_tensor", _keep_view)
    try:
        yield
    finally:
        for module, original in viewless:
            module.make_viewless_tensor = original
        config_class.__post_init__ = original_post_init
        torch.cuda.current_device = original_device
        if softmax is not None and original_mask is not None:
            softmax.get_default_causal_mask = original_mask  # type: ignore[attr-defined]
        if random is not None:
            random._CUDA_RNG_STATE_TRACKER = original_tracker  # type: ignore[attr-defined]
            random._CUDA_RNG_STATE_TRACKER_INITIALIZED = original_initialized  # type: ignore[attr-defined]


def _keep_view(inp: Any, requires_grad: bool, keep_graph: bool) -> Any:
    """Megatron's make_viewless_tensor returns a tensor with the same values that is not a view,
    by assigning `.data` (a memory saving the export cannot trace: it lifts the data as a fake
    constant). Values are what the verifier needs, so the view is kept."""
    return inp


def _replace_everywhere(prefix: str, name: str, replacement: Any) -> list[tuple[Any, Any]]:
    """Replace function `name` in every loaded module under `prefix` that imported it; the
    (module, original) pairs to restore."""
    replaced = []
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith(prefix) and callable(getattr(module, name, None)):
            replaced.append((module, getattr(module, name)))
            setattr(module, name, replacement)
    return replaced


class _NullRNGTracker:
    """Megatron's CUDA RNG state tracker without CUDA: forking a state runs the code unchanged.
    Its states only decide dropout masks and random initialisation; shardproof runs the model in
    eval mode and takes the weights from the reference, so neither reaches a verdict."""

    def reset(self) -> None:
        pass

    def add(self, name: str, seed: int) -> None:
        pass

    def get_states(self) -> dict[str, object]:
        return {}

    def set_states(self, states: dict[str, object]) -> None:
        pass

    def is_initialized(self) -> bool:
        return True

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        yield


def _causal_mask_on(device: str):
    """Megatron's default causal mask (when no attention mask is passed), built on `device`
    instead of its hard-coded "cuda"."""
    import torch

    def get_default_causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, device=device), diagonal=1).bool()

    return get_default_causal_mask


def _forget_dtensor_caches() -> None:
    """DTensor caches sharding decisions by spec, and specs compare equal across ranks: a cached
    output spec would carry the device mesh of the rank captured before (its coordinate, hence
    its shard offsets)."""
    sharding_prop = sys.modules.get("torch.distributed.tensor._sharding_prop")
    if sharding_prop is None:
        return
    import torch
    from torch.distributed.tensor import DTensor, _redistribute

    clear_native_cache = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native_cache is not None:  # the C++ dispatch fast path's cache (torch 2.13)
        clear_native_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    sharding_prop.ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    transform_infos = getattr(_redistribute, "_gen_transform_infos", None)
    if hasattr(transform_infos, "cache_clear"):
        transform_infos.cache_clear()


def reset_libraries() -> None:
    """Forget model-parallel groups that libraries cache across process-group lifetimes."""
    _forget_dtensor_caches()
    fairscale_init = sys.modules.get("fairscale.nn.model_parallel.initialize")
    if fairscale_init is not None and hasattr(fairscale_init, "destroy_model_parallel"):
        with contextlib.suppress(Exception):
            fairscale_init.destroy_model_parallel()
    megatron_state = sys.modules.get("megatron.core.parallel_state")
    if megatron_state is not None and hasattr(megatron_state, "destroy_model_parallel"):
        with contextlib.suppress(Exception):
            megatron_state.destroy_model_parallel()
