"""The normalizer's vocabulary (which ATen ops are aliases, views, unary, binary, reductions,
factories, collectives) and the small readers of fx nodes and literals its lowerings share."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from ..graph.model import SourceSite, TensorMeta
from .frames import parse_stack_trace

_ALIASES = {
    "wait_tensor",
    "clone",
    "contiguous",
    "alias",
    "detach",
    "lift_fresh_copy",
    "lift_fresh",
    "alias_copy",
    "detach_copy",
    "_conj",
    "resolve_conj",
    "resolve_neg",
}
_DROPPED = {
    "_assert_tensor_metadata",
    "_assert_scalar",
    "sym_constrain_range",
    "sym_constrain_range_for_size",
    "_assert_async",
    "sym_size",
    "sym_numel",
    "sym_stride",
}
_VIEWS = {
    "view",
    "_unsafe_view",
    "reshape",
    "unsqueeze",
    "squeeze",
    "flatten",
    "unflatten",
    "view_copy",
    "squeeze_copy",
    "unsqueeze_copy",
    "_reshape_alias",
    "_reshape_copy",
    "view_as",  # fairscale's identity mappings at world size 1 return their input as a view
}
_UNARY = {
    "neg",
    "silu",
    "relu",
    "rsqrt",
    "sqrt",
    "exp",
    "log",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "abs",
    "reciprocal",
    "logical_not",
    "bitwise_not",
    "erf",
    "exp2",
    "log1p",
    "expm1",
    "sign",
    "floor",
    "ceil",
    "round",
    "square",
    "hardtanh",
    "softplus",
    "gelu",
    "isnan",
    "isinf",
    "mish",
    "elu",
    "leaky_relu",
    "relu6",
    "hardsigmoid",
    "hardswish",
    "log2",
    "trunc",
    "frac",
}
_BINARY = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "maximum": "maximum",
    "minimum": "minimum",
    "pow": "pow",
    "eq": "eq",
    "ne": "ne",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "__or__": "or",
    "__and__": "and",
    "__xor__": "xor",
    "bitwise_or": "or",
    "bitwise_and": "and",
    "bitwise_xor": "xor",
    "logical_or": "or",
    "logical_and": "and",
    "logical_xor": "xor",
    "remainder": "remainder",
    "floor_divide": "floor_divide",
    "atan2": "atan2",
    "fmod": "fmod",
    "rsub": "rsub",
}
_REDUCTIONS = {
    "mean": "mean",
    "sum": "sum",
    "amax": "amax",
    "amin": "amin",
    "prod": "prod",
    "logsumexp": "logsumexp",
    "all": "all",
    "any": "any",
}
_COLLECTIVES = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast"}
_DETERMINISTIC_FACTORIES = {
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "eye",
    "scalar_tensor",
    "zeros_like",
    "ones_like",
    "full_like",
    "tensor",
}
_SHAPED_LIKE_FACTORIES = {"zeros_like", "ones_like", "full_like"}
_UNINITIALISED_FACTORIES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _meta_of(value: Any) -> TensorMeta | None:
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in value.shape), dtype_name(value.dtype))
    return None


def _slice_bounds(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """[start, end) of a slice of a dim of `size`, as Python clamps it (None: the whole dim)."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    return start, max(start, min(size, end + size if end < 0 else end))


_REAL_OF_COMPLEX = {"complex64": "float32", "complex128": "float64", "complex32": "float16"}


def _scalar_literal(value: torch.fx.Node) -> Any:
    """The number of `x[mask] = 0.0` (traced as index_put of `scalar_tensor(0.0)`), else None."""
    if value.op == "call_function" and getattr(value.target, "__name__", "").startswith("scalar_tensor"):
        number = value.args[0] if value.args else None
        if isinstance(number, int | float) and not isinstance(number, bool):
            return _literal(number)
    return None


def _filled_with(value: torch.fx.Node) -> Any:
    """The number a factory fills its tensor with (`zeros_like(x)`, `full((n,), 2.0)`,
    `scalar_tensor(0.0)`), else None."""
    if value.op != "call_function":
        return None
    number = _fill_number(_op_name(value), value.args, value.kwargs)
    return None if number is None else _literal(number)


def _fill_number(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | float | None:
    """The one number a factory call fills its tensor with, else None."""
    if name in ("zeros", "zeros_like", "ones", "ones_like"):
        return 0 if name.startswith("zeros") else 1
    if name in ("full", "full_like"):
        number = args[1] if len(args) > 1 else kwargs.get("fill_value")
    elif name == "scalar_tensor":
        number = args[0] if args else kwargs.get("s")
    else:
        return None
    return number if isinstance(number, int | float) and not isinstance(number, bool) else None


def _all_zeros(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a factory call makes a tensor of zeros (a sum's start: `out = zeros_like(x)`)."""
    return _fill_number(name, args, kwargs) == 0


def _literal(value: Any) -> Any:
    """JSON-able rendering of a non-tensor argument."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.device | torch.layout | torch.memory_format):
        return str(value)
    if isinstance(value, list | tuple):
        return [_literal(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int | float | bool | str) or value is None:
        return value
    return repr(value)


# ops along one dim: name -> position of the dim among the arguments
_ALONG = {"topk": 2, "sort": 1, "cumsum": 1, "cumprod": 1, "cummax": 1, "cummin": 1}


def _einsum_plan(equation: str) -> tuple[str, str, str] | None:
    """(a, b, out) letters of a two-operand einsum that `op_einsum` writes out, else None."""
    if "->" not in equation or "." in equation:
        return None
    inputs, out = equation.split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    terms = (a, b, out)
    if not all(t.isalpha() and len(set(t)) == len(t) for t in terms if t) or not a or not b:
        return None
    if any(c not in a and c not in b for c in out):
        return None
    if any((c in a) != (c in b) and c not in out for c in a + b):
        return None  # a letter summed over one operand only
    return a, b, out


def _is_arange(value: Any, length: int) -> bool:
    """Whether value is torch.arange(length) (start 0, step 1)."""
    if not isinstance(value, torch.fx.Node) or _op_name(value) != "arange":
        return False
    numbers = [a for a in value.args if isinstance(a, int)]
    start = value.kwargs.get("start", numbers[0] if len(numbers) > 1 else 0)
    end = value.kwargs.get("end", numbers[1] if len(numbers) > 1 else (numbers[0] if numbers else None))
    step = value.kwargs.get("step", numbers[2] if len(numbers) > 2 else 1)
    return (start, end, step) == (0, length, 1)


def _op_name(fx: torch.fx.Node) -> str:
    target = fx.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def _target_name(fx: torch.fx.Node) -> str:
    target = fx.target
    if hasattr(target, "name") and callable(target.name):
        return str(target.name())
    return str(target)


def _site_of(fx: torch.fx.Node) -> SourceSite | None:
    return parse_stack_trace(fx.meta.get("stack_trace"))


def _module_of(fx: torch.fx.Node) -> tuple[str, str]:
    stack = fx.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, module_type = list(stack.values())[-1]
    return str(path), str(module_type)


def _without_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
