"""DTensor: parameters sharded by plans (torch's `parallelize_module`, Hugging Face's tp_plan).

Export traces a module whose parameters are DTensors after `DTensorSpec` is registered as a
pytree constant; it unwraps each parameter into its local tensor, named
`<module>.parametrizations.<name>.original0`. Decomposing the traced program to core aten
runs DTensor's sharding propagation once more and leaves plain aten on local shards with the
collectives explicit (measured with torch 2.13.0). The empty decomposition table is not
enough: DTensor has no sharding rule for composite ops such as `aten.linear`, so composite ops
are decomposed (and the reference's program gets the same decompositions, see program.py).

A DTensor parameter's relation to the reference comes from its placements, not from how the
builder produced it: `Shard(d)` on a mesh dimension is the rank's `torch.chunk` of dim d (in
mesh-dimension order when several mesh dimensions shard), `Replicate()` the whole tensor, and
`_StridedShard(d, split_factor=k)` (Hugging Face's `packed_colwise`) the rank's chunk of each of
the k parts of dim d, concatenated.

One DTensor operation does not export: the embedding of a weight sharded along the vocabulary
(`RowwiseParallel` on an `nn.Embedding`). DTensor keeps the mask of out-of-shard tokens inside
the output's placement (`_MaskPartial`), so the traced program would hold a fake tensor as a
constant. While capturing, `F.embedding` of such a weight computes what DTensor computes, in
plain operations on the local shard: shift the tokens by the shard's offset, look up, zero the rows
of tokens outside the shard, and hand on a partial sum (`Partial()`), which the module's output
layout reduces exactly as the masked partial would be (all-reduce, or reduce-scatter for a
sequence-sharded output). The numeric witness runs the real DTensor code, unpatched.

DTensor has no CPU sharding rule for `scaled_dot_product_attention` and falls back to its math
decomposition (a dozen operations with the causal mask built in). While capturing, attention
is kept whole with the one rule that is plainly right: queries, keys and values sharded alike
along the heads (dim 1) give the output sharded along the heads; replicated give replicated.

A mistake in a plan shows up where the module runs (`self.output(h)`), but it is made in the
plan. While a rank is built, every parallel style applied is recorded with the user's calls that
applied it (`parallelize_module`, or Hugging Face's `maybe_distribute_model`) and the layouts the
style declares (plan_layouts.py); the entry of a plan dict in the user's code naming that module
(found in the source with `ast`, in the applying function or the caller that handed it the plan)
becomes the module's plan entry. An error raised inside a parallelized module is reported there,
and so is a discrepancy whose layout the plan decided (localize/plans.py).
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import functools
import linecache
import math
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..graph.model import Frame, PlanLayouts
from ..relations.expr import CatOf, Expr, SliceOf
from .frames import library_of, live_user_frames
from .plan_layouts import layouts_of, merged

_LOCAL_TENSOR_SUFFIX = ".original0"
_registered = False


def uses_dtensor(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def prepare_export() -> None:
    """Let export treat DTensor's spec as a constant (once per process: pytree forbids a second
    registration)."""
    global _registered
    if _registered:
        return
    import torch.utils._pytree as pytree
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    with contextlib.suppress(ValueError):  # registered by someone else (the user's code, or torch)
        pytree.register_constant(DTensorSpec)
    _registered = True


def global_values(value: object) -> object:
    """`value` with every DTensor in it replaced by the global tensor it stands for (a sharded or
    partial output is gathered or reduced, as `full_tensor()` does): what a rank returns."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda leaf: leaf.full_tensor() if is_dtensor(leaf) else leaf, value)


@contextlib.contextmanager
def global_outputs(module: nn.Module) -> Iterator[None]:
    """While active, `module` returns its DTensor outputs as the global tensors they stand for."""
    handle = module.register_forward_hook(lambda _module, _inputs, output: global_values(output))
    try:
        yield
    finally:
        handle.remove()


def exported_name(name: str) -> str:
    """The name export gives the local tensor of DTensor parameter `name`."""
    prefix, _, leaf = name.rpartition(".")
    owner = f"{prefix}." if prefix else ""
    return f"{owner}parametrizations.{leaf}{_LOCAL_TENSOR_SUFFIX}"


def is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local_relation(tensor: torch.Tensor, reference: Expr) -> Expr | None:
    """This rank's local tensor of DTensor `tensor` over the reference tensor it distributes,
    from its placements; None for a placement without a fixed relation (Partial)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the mesh
        return None
    strided = [p for p in tensor.placements if isinstance(p, _StridedShard)]
    if strided:
        return _strided_relation(tensor, reference, strided[0], mesh, coordinate)
    bounds = [(0, size) for size in reference.shape]
    for mesh_dim, placement in enumerate(tensor.placements):
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, Shard):
            return None
        dim = placement.dim % len(bounds)
        start, end = bounds[dim]
        parts = mesh.size(mesh_dim)
        chunk = math.ceil((end - start) / parts)
        lo = min(start + coordinate[mesh_dim] * chunk, end)
        bounds[dim] = (lo, min(lo + chunk, end))
    expr = reference
    for dim, (start, end) in enumerate(bounds):
        if (start, end) == (0, reference.shape[dim]):
            continue
        shape = tuple(end - start if d == dim else size for d, size in enumerate(expr.shape))
        expr = SliceOf(source=expr, dim=dim - len(bounds), start=start, end=end, shape=shape, dtype=reference.dtype)
    if tuple(expr.shape) != tuple(tensor.to_local().shape):
        return None
    return expr


def _strided_relation(
    tensor: torch.Tensor, reference: Expr, placement: object, mesh: object, coordinate: tuple
) -> Expr | None:
    """`_StridedShard(dim, split_factor=k)` (a packed weight sharded part by part, Hugging Face's
    `packed_colwise`): the rank's chunk of each of the k parts, concatenated."""
    from torch.distributed.tensor import Replicate

    others = [p for p in tensor.placements if p is not placement]
    if len(tensor.placements) != 1 and not all(isinstance(p, Replicate) for p in others):
        return None
    mesh_dim = list(tensor.placements).index(placement)
    dim = placement.dim % len(reference.shape)
    size, parts, ranks = reference.shape[dim], placement.split_factor, mesh.size(mesh_dim)
    if size % parts:
        return None
    part = size // parts
    chunk = math.ceil(part / ranks)
    pieces: list[Expr] = []
    for index in range(parts):
        start = min(index * part + coordinate[mesh_dim] * chunk, (index + 1) * part)
        end = min(start + chunk, (index + 1) * part)
        shape = tuple(end - start if d == dim else n for d, n in enumerate(reference.shape))
        pieces.append(
            SliceOf(
                source=reference,
                dim=dim - len(reference.shape),
                start=start,
                end=end,
                shape=shape,
                dtype=reference.dtype,
            )
        )
    local_shape = tuple(tensor.to_local().shape)
    if sum(p.shape[dim] for p in pieces) != local_shape[dim]:
        return None
    return CatOf(parts=tuple(pieces), dim=dim - len(reference.shape), shape=local_shape, dtype=reference.dtype)


def _vocab_sharded(weight: object) -> bool:
    from torch.distributed.tensor import Shard

    return (
        isinstance(weight, torch.Tensor)
        and is_dtensor(weight)
        and weight.device_mesh.ndim == 1
        and isinstance(weight.placements[0], Shard)
        and weight.placements[0].dim == 0
    )


@contextlib.contextmanager
def traceable_embeddings() -> Iterator[None]:
    """Lookups in vocabulary-sharded DTensor weights as explicit operations while capturing (see
    the module docstring). `F.embedding` is replaced, not the modules' forwards, because plans
    wrap those (Hugging Face installs its own forward around the original)."""
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Partial, Shard

    original = F.embedding

    def embedding(tokens: torch.Tensor, weight: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        max_norm = args[1] if len(args) > 1 else kwargs.get("max_norm")
        if not _vocab_sharded(weight) or max_norm is not None:
            return original(tokens, weight, *args, **kwargs)
        mesh = weight.device_mesh
        rows, offset = Shard.local_shard_size_and_offset(weight.shape[0], mesh.size(0), mesh.get_coordinate()[0])
        local_tokens = tokens.to_local() if is_dtensor(tokens) else tokens
        outside = (local_tokens < offset) | (local_tokens >= offset + rows)
        looked_up = original((local_tokens - offset).masked_fill(outside, 0), weight.to_local())
        partial = looked_up.masked_fill(outside.unsqueeze(-1), 0.0)
        return DTensor.from_local(partial, mesh, [Partial()], run_check=False)

    F.embedding = embedding
    try:
        yield
    finally:
        F.embedding = original


def _attention_shardings(*args: object, **kwargs: object) -> list[tuple[list[object], list[object]]]:
    """Acceptable (output, inputs) placements of aten.scaled_dot_product_attention."""
    from torch.distributed.tensor import Replicate, Shard

    del kwargs
    tensors = [i < 3 or hasattr(arg, "placements") for i, arg in enumerate(args)]
    replicated = [Replicate() if is_tensor else None for is_tensor in tensors]
    by_heads = [Shard(1) if is_tensor else None for is_tensor in tensors]
    if any(tensors[3:]):  # an explicit mask broadcasts over heads: keep it whole
        return [([Replicate()], replicated)]
    return [([Replicate()], replicated), ([Shard(1)], by_heads)]


@contextlib.contextmanager
def attention_by_heads() -> Iterator[None]:
    """Attention as one operation on local heads while capturing (see the module docstring)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import register_sharding

    op = torch.ops.aten.scaled_dot_product_attention.default
    propagator = DTensor._op_dispatcher.sharding_propagator
    previous_strategy = propagator.op_strategy_funcs.get(op)
    previous_info = propagator.op_to_schema_info.get(op)
    register_sharding(op)(_attention_shardings)
    try:
        yield
    finally:
        restore = ((propagator.op_strategy_funcs, previous_strategy), (propagator.op_to_schema_info, previous_info))
        for table, previous in restore:
            if previous is None:
                table.pop(op, None)
            else:
                table[op] = previous
        propagator.propagate_op_sharding.cache_clear()


# The composite ATen ops `F.cross_entropy` / `F.nll_loss` / `F.log_softmax` are made of. Run
# eagerly they decompose before DTensor sees them, into the ops `loss_parallel()` handles
# (`_log_softmax`, `nll_loss_forward`), which take a plain target next to sharded logits. Export
# traces above that decomposition, so DTensor receives the composite op itself and rejects the
# mix of a plain target and a DTensor.
_COMPOSITE_LOSS_OPS = (
    "cross_entropy_loss.default",
    "log_softmax.int",
    "nll_loss_nd.default",
    "nll_loss.default",
    "nll_loss2d.default",
)


@contextlib.contextmanager
def losses_as_in_eager() -> Iterator[None]:
    """While capturing, DTensor runs the composite loss ops as their decompositions, as eager mode
    does, so `loss_parallel()` applies to them. Export records a DTensor op in its graph and runs
    it through DTensor only when the graph is decomposed, after the user's `with loss_parallel():`
    block has exited: so the loss handlers that block installs stay installed until the capture
    ends (DTensor's default for a class-sharded log_softmax, an all-gather, computes the same
    values; only the collectives differ)."""
    from torch.distributed.tensor.parallel import loss

    composite = [_aten_op(name) for name in _COMPOSITE_LOSS_OPS]
    with _handlers_restored(composite + list(loss.customized_loss_ops)) as handlers:
        for op in composite:
            handlers[op] = _decomposed
        disable = loss._disable_custom_loss_ops
        loss._disable_custom_loss_ops = lambda: None
        try:
            yield
        finally:
            loss._disable_custom_loss_ops = disable


@contextlib.contextmanager
def metadata_asserts_on_local_tensors() -> Iterator[None]:
    """Export asserts a tensor's dtype and device after a conversion (`x.float()`); on a DTensor,
    DTensor checks it against a stand-in on the mesh's device (cpu), while the capture's local
    tensors are on meta. The assertion is about the local tensor, so it is made on that."""

    op = torch.ops.aten._assert_tensor_metadata.default

    def on_local(op_call: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        local = [a.to_local() if is_dtensor(a) else a for a in args]  # type: ignore[attr-defined]
        return op_call(*local, **(kwargs or {}))

    with _handlers_restored([op]) as handlers:
        handlers[op] = on_local
        yield


@contextlib.contextmanager
def _handlers_restored(ops: list[torch._ops.OpOverload]) -> Iterator[dict[object, object]]:
    """DTensor's process-wide table of custom op handlers, with the entries of `ops` put back as
    they were when the context ends (whoever changed them inside it)."""
    from torch.distributed.tensor import DTensor

    handlers = DTensor._op_dispatcher._custom_op_handlers
    previous = {op: handlers.get(op) for op in ops}
    try:
        yield handlers
    finally:
        for op, handler in previous.items():
            if handler is None:
                handlers.pop(op, None)
            else:
                handlers[op] = handler


def _aten_op(name: str) -> torch._ops.OpOverload:
    packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def _decomposed(op: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    return op.decompose(*args, **(kwargs or {}))


def decomposition_table() -> dict[object, object]:
    """The decompositions DTensor needs: composite ops only (it has sharding rules for the ops
    they decompose into), with attention kept whole (see `attention_by_heads`). Other ops stay
    as traced, the way the reference is captured (`silu` stays `silu`)."""
    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    table = torch.export.default_decompositions()
    return {
        op: decomposition
        for op, decomposition in table.items()
        if op is not torch.ops.aten.scaled_dot_product_attention.default
        and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), composite)
    }


def _style_classes() -> list[type]:
    from torch.distributed.tensor.parallel.style import ParallelStyle

    found, pending = [], [ParallelStyle]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


@dataclass(frozen=True)
class AppliedStyle:
    module: nn.Module
    style: str
    call: Frame  # the user's line that applied the plan
    written_by_user: bool  # torch plans are the user's dict; a model's built-in plan is not
    layouts: PlanLayouts | None = None  # what the style declares of the module's activations
    callers: tuple[Frame, ...] = ()  # the user's frames around `call`, outermost first


def local_storage(tensor: object) -> int:
    """The storage of a DTensor's local tensor."""
    return tensor._local_tensor.untyped_storage()._cdata  # type: ignore[attr-defined]


@contextlib.contextmanager
def recording_distributed_sources(expr_of: Callable[[torch.Tensor], Expr]) -> Iterator[dict[int, tuple[object, Expr]]]:
    """What every `distribute_tensor` call distributed, while the context is active: the storage of
    the DTensor's local tensor (kept alive) -> the expression of the global tensor it was made
    from (the storage, because `nn.Parameter` wraps the local tensor anew).
    A DTensor's placements say how its local tensor relates to that global tensor; its local data
    itself comes from a scatter, which the fake process group does not perform."""
    sources: dict[int, tuple[object, Expr]] = {}
    api = sys.modules.get("torch.distributed.tensor._api")
    if api is None:
        yield sources
        return
    original = api.distribute_tensor

    @functools.wraps(original)
    def distribute_tensor(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        out = original(tensor, *args, **kwargs)
        with contextlib.suppress(Exception):  # a source the tracker cannot name stays unknown
            sources[local_storage(out)] = (out._local_tensor, expr_of(tensor))
        return out

    # modules that imported the function by name (parallel styles, distribute_module) call theirs
    holders = [m for m in list(sys.modules.values()) if getattr(m, "distribute_tensor", None) is original]
    for holder in holders:
        holder.distribute_tensor = distribute_tensor
    try:
        yield sources
    finally:
        for holder in holders:
            holder.distribute_tensor = original


@contextlib.contextmanager
def recording_plan_entries() -> Iterator[list[AppliedStyle]]:
    """Every parallel style applied while the context is active, with the user's call that applied
    it: torch's `ParallelStyle._apply` (parallelize_module) and Hugging Face's
    `apply_tensor_parallelism` (a model's tp_plan)."""
    recorded: list[AppliedStyle] = []
    restore: list[tuple[object, str, object]] = []

    def user_calls() -> tuple[Frame, ...]:
        """The frames of the user's own code (not of an installed library), outermost first."""
        own = [f for f in live_user_frames(skip=2) if library_of(f.filename) is None]
        return tuple(Frame(f.filename, f.lineno or 0, f.name) for f in own)

    if "torch.distributed.tensor.parallel" in sys.modules:

        def recording(original):
            @functools.wraps(original)
            def _apply(style: object, module: nn.Module, device_mesh: object) -> object:
                calls = user_calls()
                if calls:
                    name = type(style).__name__
                    recorded.append(AppliedStyle(module, name, calls[-1], True, layouts_of(style), calls[:-1]))
                return original(style, module, device_mesh)

            return _apply

        for cls in _style_classes():
            if "_apply" in vars(cls):
                restore.append((cls, "_apply", vars(cls)["_apply"]))
                cls._apply = recording(vars(cls)["_apply"])  # type: ignore[attr-defined]

    hf_parallel = sys.modules.get("transformers.distributed.tensor_parallel")
    if hf_parallel is not None and hasattr(hf_parallel, "apply_tensor_parallelism"):
        original_apply = hf_parallel.apply_tensor_parallelism

        def apply_tensor_parallelism(model: nn.Module, tp_mesh: object, tp_plan: dict[str, str]) -> object:
            calls = user_calls()
            modules = dict(model.named_modules())
            styles = getattr(hf_parallel, "ALL_PARALLEL_STYLES", {})
            for name, style in tp_plan.items():
                owner = modules.get(name) or modules.get(name.rpartition(".")[0])
                if calls and owner is not None:
                    layouts = layouts_of(styles[style]) if style in styles and name in modules else None
                    recorded.append(AppliedStyle(owner, style, calls[-1], False, layouts, calls[:-1]))
            return original_apply(model, tp_mesh, tp_plan)

        for module in (hf_parallel, sys.modules.get("transformers.distributed.mixin")):
            if module is not None and getattr(module, "apply_tensor_parallelism", None) is original_apply:
                restore.append((module, "apply_tensor_parallelism", original_apply))
                module.apply_tensor_parallelism = apply_tensor_parallelism  # type: ignore[attr-defined]
    try:
        yield recorded
    finally:
        for owner, name, original in restore:
            setattr(owner, name, original)


def plan_entries(root: nn.Module, recorded: list[AppliedStyle]) -> dict[str, Frame]:
    """Module path -> the plan entry that parallelized it: the line of the plan-dict key naming
    it in the user's code, in the function that applied the plan or, when that one was handed the
    plan (a helper mapping style names to styles), in the nearest caller that names the module;
    else anywhere in the applying call's file. A torch plan entry falls back to the
    `parallelize_module` call; an entry of a model's built-in plan that the user did not write has
    none."""
    paths = {id(module): name for name, module in root.named_modules(remove_duplicate=False)}
    entries: dict[str, Frame] = {}
    for applied in recorded:
        path = paths.get(id(applied.module))
        if path is None:
            continue
        file, key = applied.call.file, None
        for frame in (applied.call, *reversed(applied.callers)):
            key = _plan_key(frame.file, frame.line, path, whole_file=False)
            if key is not None:
                file = frame.file
                break
        key = key or _plan_key(file, applied.call.line, path)
        if key is None and not applied.written_by_user:
            continue
        line, column, end_column = key if key is not None else (applied.call.line, None, None)
        entries[path] = Frame(
            file,
            line,
            applied.style,
            linecache.getline(file, line).strip(),
            column=column,
            end_line=line if column is not None else None,
            end_column=end_column,
        )
    return entries


def plan_layouts(root: nn.Module, recorded: list[AppliedStyle]) -> dict[str, PlanLayouts]:
    """Module path -> the layouts its plan entries declare (merged when several styles apply)."""
    paths = {id(module): name for name, module in root.named_modules(remove_duplicate=False)}
    layouts: dict[str, PlanLayouts] = {}
    for applied in recorded:
        path = paths.get(id(applied.module))
        found = merged(layouts.get(path), applied.layouts) if path is not None else None
        if found is not None:
            layouts[path] = found
    return layouts


def plan_entry_of_failure(exc: BaseException, root: nn.Module, entries: dict[str, Frame]) -> tuple[str, Frame] | None:
    """(module path, plan entry) of the innermost parallelized module running when `exc` was
    raised: a plan mistake often shows as a shape error inside the module it misconfigured."""
    if not entries:
        return None
    paths = {id(module): name for name, module in root.named_modules(remove_duplicate=False)}
    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        for name in ("self", "module"):
            path = paths.get(id(frame.f_locals.get(name)))
            if path is not None and path in entries:
                found = (path, entries[path])
    return found


@functools.lru_cache(maxsize=64)
def _parsed(file: str, text: str) -> ast.Module | None:
    del file
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _plan_key(file: str, call_line: int, path: str, whole_file: bool = True) -> tuple[int, int, int] | None:
    """(line, column, end column) of the plan-dict key naming `path` in the function around the
    `parallelize_module` call at `call_line` (then, with `whole_file`, anywhere in the file): keys
    are relative to the module the call was given, so the longest key that ends the path wins,
    the nearest one to the call among equals."""
    text = "".join(linecache.getlines(file))
    tree = _parsed(file, text) if text else None
    if tree is None:
        return None
    scope: ast.AST = tree
    for node in ast.walk(tree):
        encloses = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.lineno <= call_line <= (node.end_lineno or 0)
        )
        if encloses and (scope is tree or node.lineno > getattr(scope, "lineno", 0)):
            scope = node
    found = _nearest_key(scope, call_line, path)
    if found is not None or scope is tree or not whole_file:
        return found
    return _nearest_key(tree, call_line, path)


def _nearest_key(scope: ast.AST, call_line: int, path: str) -> tuple[int, int, int] | None:
    best: tuple[int, int, ast.Constant] | None = None
    for node in ast.walk(scope):
        if not isinstance(node, ast.Dict):
            continue
        for key in node.keys:
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            pattern = key.value
            if not (path == pattern or fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, "*." + pattern)):
                continue
            rank = (len(pattern), -abs(key.lineno - call_line))
            if best is None or rank > best[:2]:
                best = (*rank, key)
    if best is None:
        return None
    key = best[2]
    return key.lineno, key.col_offset, key.end_col_offset or key.col_offset
