"""Operations on meta tensors, answered from what the same operation gave before.

The eager run that records a model's blocks (blocks.py) runs every layer's operations on meta
tensors, and most of that time is spent in torch's meta kernels (shape functions written in
Python). A meta kernel computes the metadata of its results (shape, strides, dtype) from the
metadata of its arguments and its literal arguments only: meta tensors hold no data. So an
operation that neither writes an argument nor returns a view of one gives, for equal arguments'
metadata and equal literals, results with equal metadata, and fresh ones: they are made directly
(`empty_strided`) when the same call was seen before. The results are the same as the kernel's
in everything a later operation can read.

A call is answered this way only when every piece of its key is known to determine the kernel's
answer: tensors on the meta device (a CPU tensor has data a later `.item()` reads), literals of
plain types (numbers, strings, dtypes, devices, layouts, memory formats), the default dtype
(factories and Python scalars use it), and results that are plain meta tensors at offset 0.
Anything else runs the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

_LITERAL_TYPES = (int, float, bool, str, complex, type(None))
_LITERAL_TYPES += (torch.dtype, torch.device, torch.layout, torch.memory_format)
_MAX_ENTRIES = 200_000

# func -> whether its results are fresh (no argument written, no result aliasing an argument)
_PURE: dict[Any, bool] = {}
# key -> how to make its results again (None: the results cannot be made from metadata)
_SEEN: dict[tuple[Any, ...], Callable[[], Any] | None] = {}


def run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`func(*args, **kwargs)`, made from metadata when the same call was seen before."""
    if not _is_pure(func):
        return func(*args, **kwargs)
    key = _key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    make = _SEEN.get(key, _MISSING)
    if make is _MISSING:
        result = func(*args, **kwargs)
        if len(_SEEN) >= _MAX_ENTRIES:
            _SEEN.clear()
        _SEEN[key] = _maker(result)
        return result
    if make is None:
        return func(*args, **kwargs)
    return make()  # type: ignore[operator]


_MISSING = object()


def _is_pure(func: Any) -> bool:
    pure = _PURE.get(func)
    if pure is None:
        schema = getattr(func, "_schema", None)
        pure = (
            schema is not None
            and not schema.is_mutable
            and not any(r.alias_info is not None for r in schema.returns)
            and not any(a.alias_info is not None for a in schema.arguments)
        )
        _PURE[func] = pure
    return pure


class _Unknown(Exception):
    """An argument whose effect on the kernel's answer the key cannot describe."""


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            raise _Unknown
        if value.device.type != "meta" or value.is_conj() or value.is_neg():
            raise _Unknown
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.requires_grad)
    if isinstance(value, list | tuple):
        return (type(value) is list, tuple(_describe(v) for v in value))
    if isinstance(value, _LITERAL_TYPES):
        return (type(value), value)
    raise _Unknown


def _key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    try:
        described = tuple(_describe(a) for a in args)
        named = tuple((name, _describe(v)) for name, v in kwargs.items())
    except _Unknown:
        return None
    return (func, torch.get_default_dtype(), described, named)


def _maker(result: Any) -> Callable[[], Any] | None:
    """How to make results with `result`'s metadata (None when they cannot be made from it)."""
    if isinstance(result, torch.Tensor):
        if type(result) is not torch.Tensor or result.device.type != "meta" or result.storage_offset() != 0:
            return None
        if result.is_conj() or result.is_neg() or result.requires_grad:
            return None
        shape, stride, dtype = tuple(result.shape), result.stride(), result.dtype
        sample = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        if sample.untyped_storage().nbytes() != result.untyped_storage().nbytes():
            return None  # a storage of another size than its view needs (a later view could tell)
        return lambda: torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if isinstance(result, tuple | list) and type(result) in (tuple, list):
        tensors = [r for r in result if isinstance(r, torch.Tensor)]
        if len({t.untyped_storage()._cdata for t in tensors}) != len(tensors):
            return None  # results sharing memory
        makers = [_maker(r) for r in result]
        if any(m is None for m in makers):
            return None
        kind = type(result)
        return lambda: kind(m() for m in makers)  # type: ignore[misc]
    if isinstance(result, int | float | bool) and not isinstance(result, torch.SymInt | torch.SymFloat):
        return lambda: result
    return None


def leaves(value: Any) -> list[Any]:
    """The leaves of operation arguments and results in pytree's order (lists, tuples and dicts
    nest; everything else is a leaf), without pytree's generality: this runs for every operation."""
    if isinstance(value, list | tuple):
        if type(value) not in (list, tuple, torch.Size):
            return tree_leaves(value)  # a named tuple of results
        found: list[Any] = []
        for item in value:
            if isinstance(item, list | tuple | dict):
                found.extend(leaves(item))
            else:
                found.append(item)
        return found
    if isinstance(value, dict):
        return leaves(list(value.values()))
    return [value]
