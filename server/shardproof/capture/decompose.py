"""Operations the normalizer has no lowering for, written out as torch itself writes them.

An operation that would otherwise stay an opaque call (`layer_norm`, `group_norm`, `softplus`,
`logsumexp`, `nll_loss`, ...) has no relation rules on sharded inputs, so a proof stops at it. Torch
maintains decompositions for hundreds of such operations; each is traced one level (the function
the table holds, run by `make_fx` on meta tensors of the call's shapes) and its operations are
normalized in place of the call, each in turn written out the same way if it needs to be. The
reference and every rank go through the same normalizer, so the same operation meets the same
operations on both sides. The site of every operation of a decomposition is the call's.

Operations the rule library matches as opaque calls (`verify.opaque_rules.opaque_ops`, such as
`embedding_dense_backward`) stay whole: a rule knows them as they are. A decomposition is used only
when it stays in ATen: the table's references written in prims
(torch's lowest level, which the normalizer does not read) and random operations (whose values no
proof can relate) keep the call opaque.

Ops that torch defines by other ATen ops (CompositeImplicitAutograd, such as `movedim`) and that the
table lacks are written out as their own implementation, what eager mode runs.

Our own decompositions, for what the table writes only in prims: `var` and `var_mean` (the table's
are `prims.var`), as the mean of squared deviations (with the correction), which is what they compute;
and `scaled_dot_product_attention` as its documentation defines it (scores, scale, causal mask,
softmax, values), the form a program that writes attention out by hand computes: torch's own
decomposition scales the queries and the keys by the square root of the scale each, and adds the
mask as a bias (see `_attention`).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

if TYPE_CHECKING:
    from .normalize import _Builder

# How deep decompositions may nest (layer_norm -> native_layer_norm -> var_mean -> mean, ...).
MAX_DEPTH = 6
_RANDOM = ("bernoulli", "rand", "randn", "randint", "normal", "uniform", "multinomial", "exponential", "dropout")


def _var(x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> torch.Tensor:
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    count = 1
    for d in dims:
        count *= x.shape[d]
    deviation = x - x.mean(dims, keepdim=True)
    squares = (deviation * deviation).sum(dims, keepdim=keepdim)
    return squares / (count - (1 if correction is None else correction))


def _var_mean(
    x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    return _var(x, dims, correction=correction, keepdim=keepdim), x.mean(dims, keepdim=keepdim)


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """`scaled_dot_product_attention` as torch documents it (the reference implementation in its
    docstring): the scores `query @ key^T * scale` (scale 1 / sqrt(head dim) by default), the
    positions after each query's own masked with -inf when causal, a softmax over the keys, the
    product with the values. Grouped keys and values are repeated up to the query heads first.
    An explicit mask is applied as torch applies it: a boolean one fills the positions it leaves
    out with -inf, a float one is added to the scores; a row whose keys are all masked is zeros
    (torch's safe softmax; a plain softmax gives NaN there): the weights are filled with 0 on the
    rows the mask alone leaves without a key (scores of finite queries and keys are finite). A
    constant mask that masks no whole row (a causal mask) makes that fill nothing (the encoder
    states so), and the attention meets the one written out by hand."""
    if dropout_p != 0.0 or (attn_mask is not None and is_causal):
        raise NotImplementedError("attention with dropout stays one operation")
    factor = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    scores = query @ key.transpose(-2, -1) * factor
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril(diagonal=0)
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is None:
        return torch.softmax(scores, dim=-1) @ value
    if attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        no_key = attn_mask.logical_not().all(dim=-1, keepdim=True)
    else:
        scores = scores + attn_mask
        no_key = (attn_mask == float("-inf")).all(dim=-1, keepdim=True)
    return torch.softmax(scores, dim=-1).masked_fill(no_key, 0.0) @ value


@functools.cache
def _own() -> dict[Any, Callable[..., Any]]:
    aten = torch.ops.aten
    return {
        aten.var.correction: _var,
        aten.var_mean.correction: _var_mean,
        aten.scaled_dot_product_attention.default: _attention,
    }


def decomposition_of(target: Any) -> Callable[..., Any] | None:
    """Our own decomposition of an op overload, else torch's core ATen one, else any of torch's."""
    from torch._decomp import decomposition_table

    own = _own().get(target)
    if own is not None:
        return own
    core = _core_decompositions()
    if target in core:
        return core[target]
    table = decomposition_table.get(target)
    if table is not None:
        return table
    if _is_composite(target):
        # an op defined by other ATen ops (`movedim` by `permute`): its own implementation, which
        # is what eager mode runs
        return functools.partial(_run_composite, target)
    return None


@functools.cache
def _core_decompositions() -> dict[Any, Callable[..., Any]]:
    """torch's core ATen decompositions, materialized once: the table torch returns builds its
    entries on every membership test (about 90 ms each, 14 s of a 405B capture)."""
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions().items())


def _is_composite(target: Any) -> bool:
    name = getattr(target, "name", None)
    if not callable(name):
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(name(), torch._C.DispatchKey.CompositeImplicitAutograd)


def _run_composite(target: Any, *args: Any, **kwargs: Any) -> Any:
    return target.decompose(*args, **kwargs)


def _namespace(target: Any) -> str:
    return str(getattr(target, "namespace", "") or "")


def trace(fx: torch.fx.Node) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]] | None:
    """The call's decomposition traced on meta tensors of its arguments' shapes, and the call's
    tensor arguments in the order of the traced graph's placeholders; None when torch has none
    that stays in ATen, or it cannot be traced."""
    if not isinstance(fx.target, torch._ops.OpOverload) or any(word in str(fx.target) for word in _RANDOM):
        return None
    from ..verify.opaque_rules import opaque_ops

    if fx.target.name() in opaque_ops():
        return None
    decompose = decomposition_of(fx.target)
    if decompose is None:
        return None
    flat, spec = tree_flatten((list(fx.args), dict(fx.kwargs)))
    positions: list[int] = []
    tensors: list[torch.fx.Node] = []
    examples: list[torch.Tensor] = []
    for position, argument in enumerate(flat):
        if not isinstance(argument, torch.fx.Node):
            continue
        value = argument.meta.get("val")
        if isinstance(value, torch.Tensor):
            positions.append(position)
            tensors.append(argument)
            examples.append(torch.empty(tuple(value.shape), dtype=value.dtype, device="meta"))
        elif isinstance(value, bool | int | float):
            flat[position] = value
        else:
            return None

    def call(*values: torch.Tensor) -> Any:
        arguments = list(flat)
        for position, value in zip(positions, values, strict=True):
            arguments[position] = value
        args, kwargs = tree_unflatten(arguments, spec)
        return decompose(*args, **kwargs)

    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = make_fx(call)(*examples)
    except Exception:  # noqa: BLE001 - an op torch cannot decompose here stays an opaque call
        return None
    for node in graph.graph.nodes:
        if node.op != "call_function" or _is_return_type(node.target):
            continue
        if _namespace(node.target) == "prims" or any(word in str(node.target) for word in _RANDOM):
            return None
        if "as_strided" in str(node.target):
            return None  # raw memory layout: no better than the call it replaces
        if _writes_memory(node.target):
            # writes into a fresh buffer (`polar` as `new_empty` + `copy_` into its real and
            # imaginary views): the inlined graph has no functionalization, so the writes would
            # be lost and the value read as the uninitialised buffer
            return None
        if node.target is fx.target:
            return None  # the decomposition calls the op itself: nothing is gained
    return graph, tensors


def _writes_memory(target: Any) -> bool:
    """An in-place or out= op, or a factory of uninitialised memory."""
    schema = getattr(target, "_schema", None)
    if schema is not None and getattr(schema, "is_mutable", False):
        return True
    name = str(target)
    return any(word in name for word in ("empty", "new_empty", "empty_like", "empty_strided"))


def _is_return_type(target: Any) -> bool:
    """torch's refs wrap tuple results in a `return_types_<op>` constructor."""
    return getattr(target, "__name__", "").startswith("return_types_")


def inline(builder: _Builder, fx: torch.fx.Node) -> bool:
    """Normalize the call `fx` as the operations of its decomposition (see the module docstring);
    False when it has none to use."""
    if builder.decomposition_depth >= MAX_DEPTH:
        return False
    traced = trace(fx)
    if traced is None:
        return False
    graph, tensors = traced
    prefix = f"{fx.name}."
    nodes = list(graph.graph.nodes)
    for node in nodes:  # unique names in the program: the call's name, then the decomposition's
        node.name = prefix + node.name
    placeholders = [node for node in nodes if node.op == "placeholder"]
    for placeholder, argument in zip(placeholders, tensors, strict=True):
        builder.alias[placeholder.name] = builder.value(argument)
        if argument.name in builder.folder.values:  # a constant argument: its value inside too
            builder.folder.values[placeholder.name] = builder.folder.values[argument.name]
    inherited = {key: value for key, value in fx.meta.items() if key != "val"}
    mark = len(builder.graph.nodes)
    builder.decomposition_depth += 1
    try:
        for node in nodes:
            if node.op != "call_function":
                continue
            if _is_return_type(node.target):
                builder.multi[node.name] = [_value_or_none(builder, a) for a in node.args]
                continue
            node.meta.update(inherited)
            builder.convert(node)
    finally:
        builder.decomposition_depth -= 1
    result = next(node for node in nodes if node.op == "output").args[0]
    if isinstance(result, torch.fx.Node) and result.name in builder.multi:
        outputs: list[str | None] | str = builder.multi[result.name]
    elif isinstance(result, list | tuple):
        outputs = [_value_or_none(builder, a) for a in result]
    elif isinstance(result, torch.fx.Node):
        outputs = builder.value(result)
    else:
        outputs = []
    produced = [outputs] if isinstance(outputs, str) else [o for o in outputs if o is not None]
    if not produced or any(value not in builder.metas for value in produced):
        # a value the normalizer dropped (a scalar computation): keep the call opaque instead
        for node in builder.graph.nodes[mark:]:
            builder.nodes_by_id.pop(node.id, None)
            builder.metas.pop(node.id, None)
        del builder.graph.nodes[mark:]
        return False
    for node in builder.graph.nodes[mark:]:  # the operation they are part of (for the localizer's words)
        node.attrs["within"] = _target_name(fx)
    if isinstance(outputs, str):
        builder.alias[fx.name] = outputs
    else:
        builder.multi[fx.name] = outputs
    return True


def _target_name(fx: torch.fx.Node) -> str:
    target = fx.target
    return str(target.name()) if isinstance(target, torch._ops.OpOverload) else str(target)


def _value_or_none(builder: _Builder, argument: Any) -> str | None:
    if not isinstance(argument, torch.fx.Node):
        return None
    ids = builder.multi.get(argument.name)
    if ids is not None:
        return None
    return builder.value(argument)
