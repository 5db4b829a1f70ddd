"""Capture a joint forward-backward graph: the outputs and every trainable parameter's gradient.

`torch.export` cannot trace `torch.autograd.grad` (it leaves a fake constant behind), so a check
with `gradients` is traced with `make_fx` instead, on FakeTensors placed on the CPU: the autograd
engine then runs the backward on this thread, where the tracer sees it. The backward of custom
autograd functions (Megatron's copy-to / reduce-from regions) is user code like any other, and
its collectives are traced as functional collectives because the c10d functions themselves are
replaced while tracing (the torch-function remap export uses does not reach the backward).

Source sites: a backward operation issued by user code (a custom `backward`) keeps its own
frames; one issued by autograd's built-in derivatives gets the frames of the forward operation it
differentiates (matched by autograd's sequence number). The traced graph is then functionalised
by tracing it once more; `JointProgram` offers what `normalize.to_graph` reads of an
ExportedProgram (the graph and its signature).
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d
import torch.fx.traceback as fx_traceback
from torch import nn

from ..graph.model import GradientRole, SourceSite
from ..relations.expr import CatOf, Expr, ParamRef, SliceOf, norm_dim
from . import frames
from .remap import extended_collective_remaps


@dataclass
class JointProgram:
    """The parts of an ExportedProgram that `to_graph` reads, for a make_fx joint graph."""

    graph_module: torch.fx.GraphModule
    graph_signature: Any
    roles: list[GradientRole | None] = field(default_factory=list)  # per output: None for a forward output
    cuts: list[SourceSite] = field(default_factory=list)  # user code's detach calls in the forward

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph


@dataclass(frozen=True)
class GradientPart:
    """What a rank's gradient output stands for: (a block of) a reference parameter's gradient."""

    parameter: str  # the reference parameter
    rank_parameter: str
    dim: int | None = None  # None: the whole gradient
    start: int = 0
    end: int = 0
    offset: int = 0  # where the block sits in the rank parameter's gradient along `dim`
    whole: bool = False  # the block is the whole reference parameter (packed with others)

    def role(self, absent: bool) -> GradientRole:
        """The output role of this part's gradient (`absent`: the rank computes none)."""
        block = None if self.dim is None else (self.dim, self.offset, self.end - self.start)
        if self.dim is None or self.whole:
            return GradientRole(self.parameter, self.rank_parameter, absent=absent, rank_block=block)
        return GradientRole(
            self.parameter, self.rank_parameter, self.dim, self.start, self.end, absent=absent, rank_block=block
        )


def gradient_parts(values: dict[str, Expr], trainable: set[str]) -> dict[str, GradientPart]:
    """For every reference parameter some rank parameter holds whole or as one block, how the
    rank's gradient shows the reference gradient (the first trainable holder wins)."""
    parts: dict[str, GradientPart] = {}
    for rank_name, expr in sorted(values.items(), key=lambda item: (item[0] not in trainable, item[0])):
        pieces = expr.parts if isinstance(expr, CatOf) else (expr,)
        cat_dim = expr.dim if isinstance(expr, CatOf) else None
        offset = 0
        for piece in pieces:
            if isinstance(piece, ParamRef) and cat_dim is None:
                parts.setdefault(piece.name, GradientPart(piece.name, rank_name))
            elif isinstance(piece, ParamRef):
                size = piece.shape[cat_dim]
                parts.setdefault(piece.name, GradientPart(piece.name, rank_name, cat_dim, 0, size, offset, whole=True))
            elif isinstance(piece, SliceOf) and isinstance(piece.source, ParamRef):
                nd = len(piece.source.shape)
                dim = norm_dim(piece.dim, nd)
                if cat_dim is not None and dim != norm_dim(cat_dim, nd):
                    break  # blocks along one dim packed along another: not one block of the gradient
                parts.setdefault(
                    piece.source.name, GradientPart(piece.source.name, rank_name, dim, piece.start, piece.end, offset)
                )
            if cat_dim is not None:
                offset += piece.shape[cat_dim]
    return parts


@contextlib.contextmanager
def functional_collectives() -> Iterator[None]:
    """Replace the c10d collectives by their functional remaps (export's table, extended) for the
    duration: user code reaching `dist.all_reduce` at call time, forward or backward, is traced."""
    with extended_collective_remaps():
        table = dict(funcol.traceable_collective_remaps)
        replaced: list[tuple[Any, str, Any]] = []
        for legacy, remapped in table.items():
            name = getattr(legacy, "__name__", None)
            if name is None or name in ("isend", "irecv", "batch_isend_irecv"):
                continue
            call = _remapped_call(legacy, remapped)
            for module in (dist, c10d):
                if getattr(module, name, None) is legacy:
                    replaced.append((module, name, legacy))
                    setattr(module, name, call)
        try:
            yield
        finally:
            for module, name, legacy in replaced:
                setattr(module, name, legacy)


def _remapped_call(legacy: Callable[..., Any], remapped: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(legacy)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = dict(signature.bind(*args, **kwargs).arguments)
        if "op" in bound and not isinstance(bound["op"], str):
            bound["op"] = funcol.REDUCE_OP_TO_STR[bound["op"]]
        return remapped(**bound)

    call.__name__ = legacy.__name__
    return call


def _attribute_backward(outputs: list[torch.Tensor]) -> None:
    """While autograd runs a node's backward, nodes traced carry that node's sequence number (so
    they can take the forward operation's source site) and are marked as backward."""
    seen: set[Any] = set()
    pending = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        sequence = node._sequence_nr()

        def before(_grad_outputs: Any, sequence: int = sequence) -> None:
            fx_traceback.set_grad_fn_seq_nr(sequence)
            fx_traceback._mark_autograd_backward()

        def after(_grad_inputs: Any, _grad_outputs: Any) -> None:
            fx_traceback.reset_grad_fn_seq_nr()
            fx_traceback._reset_autograd_backward()

        node.register_prehook(before)
        node.register_hook(after)
        pending.extend(f for f, _ in node.next_functions if f is not None)


def _flat_tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


@dataclass
class JointSpec:
    """What to trace: the module, its example inputs (meta), the step (None: differentiate the
    outputs with cotangent inputs) and, for a rank, which reference gradients to return."""

    module: nn.Module
    inputs: tuple[Any, ...]
    step: Callable[..., Any] | None
    # reference: None (return every trainable parameter's gradient); rank: reference parameter ->
    # the part of a rank gradient that shows it, in the reference's order
    wanted: list[tuple[str, GradientPart | None]] | None = None


def trace_joint(spec: JointSpec) -> JointProgram:
    """Trace forward and backward of `spec.module` (meta tensors) as one functional graph."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.utils.stateless import _reparametrize_module

    module = spec.module
    named_parameters = list(module.named_parameters())
    named_buffers = list(module.named_buffers())
    # a tied parameter (one tensor under two names) is one leaf under both names
    canonical = {id(p): name for name, p in named_parameters}
    aliases = {name: canonical[id(p)] for name, p in module.named_parameters(remove_duplicate=False)}
    trainable = {name for name, p in named_parameters if p.requires_grad}
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake_like(tensor: torch.Tensor) -> torch.Tensor:
        with mode:
            return torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="cpu")

    parameters = {name: fake_like(p) for name, p in named_parameters}
    buffers = {name: fake_like(b) for name, b in named_buffers}
    inputs = torch.utils._pytree.tree_map(lambda v: fake_like(v) if isinstance(v, torch.Tensor) else v, spec.inputs)
    cotangents: list[torch.Tensor] = []
    if spec.step is None:
        every_name = {name: parameters[source] for name, source in aliases.items()}
        with mode, _reparametrize_module(module, {**every_name, **buffers}), torch.no_grad():
            cotangents = [torch.empty_like(t) for t in _flat_tensors(module(*inputs))]
    roles: list[GradientRole | None] = []

    def joint(parameters: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], inputs: Any, cotangents: Any):
        with _no_caller_frames():
            leaves = {name: p.detach().requires_grad_(name in trainable) for name, p in parameters.items()}
        tied = {name: leaves[source] for name, source in aliases.items()}
        with _reparametrize_module(module, {**tied, **buffers}), torch.enable_grad():
            if spec.step is None:
                outputs = module(*inputs)
                flat = _flat_tensors(outputs)
                _attribute_backward(flat)
                differentiable = [(o, c) for o, c in zip(flat, cotangents, strict=True) if o.requires_grad]
                if differentiable:
                    with _no_caller_frames():
                        torch.autograd.backward([o for o, _ in differentiable], [c for _, c in differentiable])
            else:
                with _attributing_every_backward():
                    outputs = spec.step(module, *inputs)
                flat = _flat_tensors(outputs)
            grads = {name: leaf.grad for name, leaf in leaves.items()}
        roles[:] = [None] * len(flat)
        gradient_roles: list[GradientRole] = []
        with _no_caller_frames():
            outputs = [o.detach() for o in flat]
            outputs += _gradient_outputs(grads, leaves, spec.wanted, trainable, gradient_roles)
        roles.extend(gradient_roles)
        return outputs

    with mode, functional_collectives(), frames.exact_stack_traces(), fx_traceback.preserve_node_meta():
        traced = make_fx(joint, tracing_mode="real", record_stack_traces=True)(parameters, buffers, inputs, cotangents)
    _sites_from_forward(traced.graph)
    with mode, fx_traceback.preserve_node_meta():
        functional = make_fx(
            torch.func.functionalize(torch.fx.Interpreter(traced).run, remove="mutations"),
            decomposition_table=_backward_decompositions(),
            tracing_mode="real",
        )(parameters, buffers, inputs, cotangents)
    signature = _signature(functional.graph, parameters, buffers, inputs, cotangents)
    return JointProgram(functional, signature, roles, _detached_sites(traced.graph))


@contextlib.contextmanager
def _no_caller_frames() -> Iterator[None]:
    """Frames of the code that called this are not sites: neither the call of `backward()` for the
    nodes autograd runs, nor the capture for what shardproof adds itself (leaves, detached
    outputs, gradient blocks)."""
    frames.BACKWARD.depth += 1
    try:
        yield
    finally:
        frames.BACKWARD.depth -= 1


@contextlib.contextmanager
def _attributing_every_backward() -> Iterator[None]:
    """A step calls backward itself: attribute the backward of every tensor it differentiates."""
    original = torch.Tensor.backward
    original_fn = torch.autograd.backward

    def backward_fn(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
        _attribute_backward(_flat_tensors(tensors))
        with _no_caller_frames():
            return original_fn(tensors, grad_tensors, *args, **kwargs)

    def tensor_backward(self: torch.Tensor, gradient: Any = None, *args: Any, **kwargs: Any) -> Any:
        _attribute_backward([self])
        with _no_caller_frames():
            return original(self, gradient, *args, **kwargs)

    torch.Tensor.backward = tensor_backward  # type: ignore[method-assign]
    torch.autograd.backward = backward_fn  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]
        torch.autograd.backward = original_fn  # type: ignore[assignment]


def _gradient_outputs(
    grads: dict[str, torch.Tensor | None],
    leaves: dict[str, torch.Tensor],
    wanted: list[tuple[str, GradientPart | None]] | None,
    trainable: set[str],
    roles: list[GradientRole],
) -> list[torch.Tensor]:
    """The gradient outputs, and their roles appended to `roles`."""
    outputs = []
    if wanted is None:  # the reference: every gradient it has
        for name, grad in grads.items():
            if name in trainable and grad is not None:
                outputs.append(grad)
                roles.append(GradientRole(name))
        return outputs
    for _, part in wanted:
        if part is None:
            continue
        grad = grads.get(part.rank_parameter)
        absent = grad is None
        if grad is None:  # frozen, detached or unused on this rank: no gradient at all
            grad = torch.zeros_like(leaves[part.rank_parameter])
        role = part.role(absent)
        outputs.append(shown_part(grad, role.rank_block))
        roles.append(role)
    return outputs


def shown_part(gradient: torch.Tensor, block: tuple[int, int, int] | None) -> torch.Tensor:
    """The part of a rank parameter's gradient at `block` (dim, offset, length; None: all of it)
    that shows a reference parameter's gradient (a role's `rank_block`)."""
    if block is None:
        return gradient
    dim, offset, length = block
    return gradient.narrow(dim, offset, length) if offset or length != gradient.shape[dim] else gradient


def _signature(
    graph: torch.fx.Graph,
    parameters: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    inputs: Any,
    cotangents: list[torch.Tensor],
) -> Any:
    """An export-like signature: placeholders in the order make_fx flattened the arguments."""
    kinds = [("PARAMETER", name) for name in parameters] + [("BUFFER", name) for name in buffers]
    flat_inputs, _ = torch.utils._pytree.tree_flatten(inputs)
    kinds += [("USER_INPUT", None) for _ in flat_inputs]
    kinds += [("USER_INPUT", None) for _ in cotangents]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs = [
        SimpleNamespace(arg=SimpleNamespace(name=node.name), kind=SimpleNamespace(name=kind), target=target)
        for node, (kind, target) in zip(placeholders, kinds, strict=True)
    ]
    output = next(n for n in graph.nodes if n.op == "output")
    outs = output.args[0]
    count = len(outs) if isinstance(outs, list | tuple) else 1
    output_specs = [SimpleNamespace(kind=SimpleNamespace(name="USER_OUTPUT")) for _ in range(count)]
    return SimpleNamespace(input_specs=specs, output_specs=output_specs)


def _detached_sites(graph: torch.fx.Graph) -> list[SourceSite]:
    """Where the user's forward detaches a value (shardproof's own detaches have no site)."""
    sites = []
    for node in graph.nodes:
        if node.target is torch.ops.aten.detach.default and not node.meta.get("autograd_backward"):
            site = frames.parse_stack_trace(node.meta.get("stack_trace"))
            # autograd also detaches tensors it saves for backward, at the site of their operation
            if site is not None and site not in sites and _calls_detach(site):
                sites.append(site)
    return sites


def _calls_detach(site: SourceSite) -> bool:
    frame = site.innermost
    if frame is None:
        return False
    text = linecache.getline(frame.file, frame.line)
    if frame.column is not None and frame.end_column is not None and frame.end_line == frame.line:
        text = text[frame.column : frame.end_column]
    # the executing expression is the detach call itself, not a call that encloses one
    return re.search(r"\bdetach_?\([^()]*\)\s*$", text.strip()) is not None


def _backward_decompositions() -> dict[Any, Callable[..., Any]]:
    """Derivative kernels written out in the elementwise operations the verifier knows (the
    forward operations are kept as they are)."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions(
        [
            aten.silu_backward,
            aten.gelu_backward,
            aten.sigmoid_backward,
            aten.tanh_backward,
            aten.threshold_backward,
            aten._softmax_backward_data,
            aten._log_softmax_backward_data,
        ]
    )


def _sites_from_forward(graph: torch.fx.Graph) -> None:
    """Give a backward node without user frames of its own the site of the forward operation it
    differentiates (the forward node with the same autograd sequence number); what autograd adds
    between nodes (summing the gradients of a value read twice) takes the site of its input."""
    forward_sites: dict[int, str] = {}
    in_backward = False
    for node in graph.nodes:
        sequence = node.meta.get("seq_nr")
        trace = node.meta.get("stack_trace")
        if node.meta.get("autograd_backward"):
            in_backward = True
            if not trace and sequence in forward_sites:
                node.meta["stack_trace"] = forward_sites[sequence]
        elif in_backward and not trace and node.op == "call_function":
            inputs = [i for i in node.all_input_nodes if i.meta.get("stack_trace")]
            if inputs:
                node.meta["stack_trace"] = inputs[0].meta["stack_trace"]
        elif sequence is not None and trace:
            forward_sites.setdefault(sequence, trace)
