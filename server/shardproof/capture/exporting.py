"""Trace a module with non-strict `torch.export` on meta tensors, as capture needs it.

What is traced: the module with its tensor attributes as buffers (their writes functionalised),
collectives remapped so that they appear as nodes, grad-mode regions inlined, and functionalised
only when a mutation other than a collective's write-back could change what is read
(`mutation_free`). A tracing failure is reported at the user's line (or at the plan entry that
parallelized the module it was raised in).
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UserCodeError, user_code_error
from ..graph.model import Frame, Graph
from . import dtensor
from .folding import ListedIndices, LiteralValues
from .frames import exact_stack_traces
from .normalize import to_graph
from .remap import extended_collective_remaps, sends_as_outputs


def attributes_as_buffers(module: nn.Module) -> None:
    """Register every tensor kept as a plain attribute as a non-persistent buffer, under the same
    name. Export lifts such tensors as constants and refuses a forward that writes them (the KV
    cache of Meta's Llama code: `self.cache_k[:bsz, pos : pos + n] = xk`); as buffers their
    writes are functionalised like any other. Values and names are unchanged."""
    for submodule in module.modules():
        for name, value in list(vars(submodule).items()):
            if not name.startswith("_") and isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                delattr(submodule, name)
                submodule.register_buffer(name, value, persistent=False)


def export_module(
    module: nn.Module, inputs: tuple[Any, ...], stage: str, plan: dict[str, Frame] | None = None
) -> torch.export.ExportedProgram:
    """Trace a module. `plan`: its plan entries (module path -> entry), so that an error raised
    inside a module a plan parallelized is reported at the plan entry."""
    attributes_as_buffers(module)
    try:
        try:
            return _export_once(module, inputs)
        except Exception as exc:  # retried below, else reported at the user line
            if not mixes_cpu_into_meta(exc):
                raise
        # A factory call without a device (`torch.zeros(n)` in forward) makes a CPU tensor, which
        # the real run adds to CPU values and the capture cannot add to meta ones: made on the
        # meta device, it is the same value for the capture (tensors that name a device keep it).
        with torch.device("meta"), LiteralValues() as literals:
            program = _export_once(module, inputs)
        program.literal_values = literals.of(program)  # type: ignore[attr-defined]
        return program
    except Exception as exc:  # noqa: BLE001 - a tracing failure is reported at the user line
        error = user_code_error(exc, stage)
        in_plan = dtensor.plan_entry_of_failure(exc, module, plan or {})
        if in_plan is not None:
            path, entry = in_plan
            ran = f" (run at {Path(error.site.file).name}:{error.site.line})" if error.site is not None else ""
            error.message = (
                f"{error.message.rstrip('.')}; raised inside `{path}`{ran}, which this plan entry parallelizes "
                f"with {entry.function}"
            )
            error.site = entry
        raise error from None


def mixes_cpu_into_meta(exc: BaseException) -> bool:
    """The error of an operation given a CPU tensor (made by a factory call without a device)
    beside meta ones."""
    text = str(exc)
    return any(
        said in text
        for said in (
            "meta and cpu",
            "cpu and meta",
            "Expected: meta, Got: cpu",
            "on device cpu is not on the expected device meta",  # an elementwise op run on meta tensors
        )
    )


def _export_once(module: nn.Module, inputs: tuple[Any, ...]) -> torch.export.ExportedProgram:
    with (
        torch.no_grad(),
        exact_stack_traces(),
        extended_collective_remaps(),
        warnings.catch_warnings(),
        quiet_torch_logs(),
        ListedIndices(),
    ):
        # torch warns about deprecated collectives and pytree internals while tracing user code
        warnings.simplefilter("ignore")
        with_dtensors = dtensor.uses_dtensor(module)
        # also for DTensors made in the forward (`DTensor.from_local(...).redistribute(...)`): their
        # spec is a constant of the traced calls, and the collectives they run are plain ones
        dtensor.prepare_export()
        if with_dtensors:
            # DTensor's sharding propagation needs composite ops decomposed (see dtensor.py)
            with (
                dtensor.traceable_embeddings(),
                dtensor.attention_by_heads(),
                dtensor.losses_as_in_eager(),
                dtensor.metadata_asserts_on_local_tensors(),
                dtensor.global_outputs(module),
            ):
                program = torch.export.export(module, inputs, strict=False)
                inline_grad_mode_regions(program.graph_module)
                return program.run_decompositions(dtensor.decomposition_table())
        with sends_as_outputs(module):
            program = torch.export.export(module, inputs, strict=False)
        inline_grad_mode_regions(program.graph_module)
        if mutation_free(program):
            return program
        return program.run_decompositions(decomp_table={})


def trace_with_gradients(
    module: nn.Module,
    inputs: tuple[Any, ...],
    step: Callable[..., Any] | None,
    stage: str,
    wanted: list[tuple[str, Any]] | None = None,
) -> Any:
    """Trace forward and backward together (checks with `gradients`, see gradients.py)."""
    from .gradients import JointSpec, trace_joint

    attributes_as_buffers(module)
    try:
        with warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            if dtensor.uses_dtensor(module):
                raise UserCodeError(
                    "gradients of DTensor models are not supported yet (their joint graph needs aot_autograd)"
                )
            return trace_joint(JointSpec(module, inputs, step, wanted))
    except UserCodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a tracing failure is reported at the user line
        raise user_code_error(exc, stage) from None


def joint_graph(program: Any, name: str, rank: int | None, world_size: int, resolve: Any = None) -> Graph:
    graph = to_graph(program, name, rank, world_size, resolve, joint=True)
    graph.gradient_roles = list(program.roles)
    graph.gradient_cuts = list(program.cuts)
    return graph


def inline_grad_mode_regions(graph_module: torch.fx.GraphModule) -> None:
    """Put the body of every `torch.enable_grad()` / `no_grad()` region back into the graph.

    Export turns a region that changes the grad mode into a `wrap_with_set_grad_enabled` call of
    a submodule (Megatron-core's transformer layer adds its residual under `enable_grad`). The
    grad mode does not change forward values, so the verifier sees the region's operations
    inline, with their own source sites."""
    graph = graph_module.graph
    regions = [
        node
        for node in graph.nodes
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "wrap_with_set_grad_enabled"
    ]
    for node in regions:
        body = getattr(graph_module, node.args[1].target)
        inline_grad_mode_regions(body)
        with graph.inserting_before(node):
            placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
            copied = graph.graph_copy(body.graph, dict(zip(placeholders, node.args[2:], strict=True)))
        results = copied if isinstance(copied, tuple | list) else (copied,)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
        if node.users:  # a single result used directly
            node.replace_all_uses_with(results[0])
        submodule = node.args[1]
        graph.erase_node(node)
        if not submodule.users:
            graph.erase_node(submodule)
            delattr(graph_module, submodule.target)
    if regions:
        graph.lint()
        graph_module.recompile()


_COLLECTIVE_WAIT = "wait_tensor"


_FLAT_APPLY = getattr(torch.ops.higher_order, "flat_apply", None)


def mutation_free(program: torch.export.ExportedProgram) -> bool:
    """True when functionalisation would change nothing we read: the only in-place ops are the
    copies that write a collective's result back into its own input buffer, that buffer is a
    fresh value (not an input, not a view) and nothing aliases it or reads it after the write.

    Then the graph is used as traced, skipping `run_decompositions` (about two thirds of the
    capture time). Anything else is functionalised, so aliasing through views stays exact.
    """
    order = {node: i for i, node in enumerate(program.graph.nodes)}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is _FLAT_APPLY:
            # a tensor subclass made in the forward (DTensor.from_local): export keeps the
            # construction as a call nothing reads; functionalising drops it
            return False
        schema = getattr(node.target, "_schema", None)
        if schema is None or not schema.is_mutable:
            continue
        name = schema.name.split("::")[-1]
        if name == "_assert_tensor_metadata":
            continue
        if name != "copy_" or len(node.args) < 2:
            return False
        destination, source = node.args[0], node.args[1]
        if not isinstance(destination, torch.fx.Node) or destination.op != "call_function":
            return False
        if getattr(destination.target, "is_view", False) or not isinstance(source, torch.fx.Node):
            return False
        source_name = getattr(getattr(source.target, "_schema", None), "name", "")
        if not source_name.endswith(_COLLECTIVE_WAIT):
            return False
        for user in destination.users:
            if user is node:
                continue
            if getattr(user.target, "is_view", False) or order[user] > order[node]:
                return False
    return True


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Tracing failures are reported by us, at the user's line; torch's own log records and the
    graph it prints to stderr when export fails are noise."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)
