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
"""

from __future__ import annotations

import contextlib
import io
import sys


def _fairscale_initialise(world_size: int) -> None:
    initialize = sys.modules.get("fairscale.nn.model_parallel.initialize")
    if initialize is None or initialize.model_parallel_is_initialized():
        return
    # fairscale announces its groups on stdout, which belongs to the CLI's report
    with contextlib.redirect_stdout(io.StringIO()):
        initialize.initialize_model_parallel(world_size)


def initialise_libraries(world_size: int) -> None:
    """Set up the model-parallel state of the libraries the user's code imported."""
    _fairscale_initialise(world_size)


def reset_libraries() -> None:
    """Forget model-parallel groups that libraries cache across process-group lifetimes."""
    fairscale_init = sys.modules.get("fairscale.nn.model_parallel.initialize")
    if fairscale_init is not None and hasattr(fairscale_init, "destroy_model_parallel"):
        with contextlib.suppress(Exception):
            fairscale_init.destroy_model_parallel()
    megatron_state = sys.modules.get("megatron.core.parallel_state")
    if megatron_state is not None and hasattr(megatron_state, "destroy_model_parallel"):
        with contextlib.suppress(Exception):
            megatron_state.destroy_model_parallel()
