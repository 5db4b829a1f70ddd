"""Infer how every rank's parameters relate to the reference's by watching the builder run.

`ProvenanceTracker` is a TorchDispatchMode active while the reference and the `parallel`
builder run on meta tensors. It identifies tensors by their storage (so views, `.data`,
`nn.Parameter(t)` and `param.data = t` all resolve to the same record), keeps for each storage
the expression of its content, and applies in-place writes (`copy_`, `fill_`, random init) to
the region of the storage they touch. The expression of any tensor is then its storage's
content read through the tensor's strided region: a slice, permutation or view of it.

Nothing is hand-written per model: the shard offsets, concatenation order of fused weights and
scaling of bias shares come out of the builder's own calls, each with the user line that made it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..graph.model import SourceSite
from ..relations.expr import (
    CastOf,
    CatOf,
    Constant,
    ExpandOf,
    Expr,
    Fresh,
    Opaque,
    ScaleOf,
    ViewOf,
    constant_digest,
    is_deterministic,
    norm_dim,
)
from .frames import LiveSites
from .lowering_tables import _all_zeros
from .meta_ops import leaves
from .storage_regions import Box, Region, StorageRecord, decode, read_box, refined, row_major

_DETERMINISTIC_FACTORIES = {
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "zeros_like",
    "ones_like",
    "full_like",
    "scalar_tensor",
    "lift_fresh",
    "lift_fresh_copy",
    "_to_copy",
    "tril",
    "triu",
    "tensor",
}
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
_RANDOM = {
    "rand",
    "randn",
    "randint",
    "rand_like",
    "randn_like",
    "randint_like",
    "bernoulli",
    "normal",
    "multinomial",
    "randperm",
}
_RANDOM_INPLACE = {
    "uniform_",
    "normal_",
    "bernoulli_",
    "random_",
    "exponential_",
    "geometric_",
    "log_normal_",
    "cauchy_",
    "erfinv_",
}
_IDENTITY = {
    "clone",
    "contiguous",
    "alias",
    "lift_fresh",
    "lift_fresh_copy",
    "detach",
    "detach_copy",
    "alias_copy",
    "_unsafe_view",
    "view_copy",
}


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _scalar_factor(value: Any) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if not math.isfinite(value):
        return None
    return Fraction(value).limit_denominator(1 << 24)


class ProvenanceTracker(TorchDispatchMode):
    """Record the provenance expression of every tensor created while active."""

    def __init__(self) -> None:
        super().__init__()
        self._records: dict[int, StorageRecord] = {}
        # Views share their input's storage and are read through their region on demand; the
        # site that made each view is kept so a slice points at the line that took it.
        self._view_sites: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], SourceSite | None] = {}
        self._sites = LiveSites()

    # -- public API -------------------------------------------------------------------------
    def register(self, tensor: torch.Tensor, expr: Expr) -> None:
        """Declare the content of `tensor`'s storage (used for reference parameters)."""
        self._records[_storage_key(tensor)] = StorageRecord(
            tensor.untyped_storage(), Region.of(tensor), _dtype(tensor), expr
        )

    def expr_of(self, tensor: torch.Tensor) -> Expr:
        record = self._records.get(_storage_key(tensor))
        if record is None:
            return Fresh(reason="created outside the traced builder", shape=tuple(tensor.shape), dtype=_dtype(tensor))
        region = Region.of(tensor)
        if region == record.layout:
            return record.content()
        site = self._view_sites.get((_storage_key(tensor), region.offset, region.shape, region.stride))
        whole = region.offset == record.layout.offset and math.prod(region.shape) == math.prod(record.layout.shape)
        if whole and row_major(record.layout) and row_major(region):
            # the whole of a contiguous storage read in another shape (a reshape that merges dims)
            content = record.content()
            source = content.source if isinstance(content, ViewOf) else content  # one view of a view
            if tuple(source.shape) == tuple(region.shape):  # viewed back to its own shape: itself
                return source
            return ViewOf(source=source, shape=region.shape, dtype=_dtype(tensor), site=site)
        box = decode(record.layout, region)
        content, layout_shape = record.content(), record.layout.shape
        if box is None:
            finer = refined(record.layout, region)
            box = decode(finer, region) if finer is not None else None
            if box is not None and finer is not None:
                content = ViewOf(source=content, shape=finer.shape, dtype=_dtype(tensor), site=site)
                layout_shape = finer.shape
        if box is None:
            return Opaque(
                op="strided view",
                sources=(record.content(),),
                shape=tuple(tensor.shape),
                dtype=_dtype(tensor),
                site=site,
            )
        return read_box(content, layout_shape, box, tuple(tensor.shape), _dtype(tensor), site)

    # -- dispatch -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._record(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - provenance is best effort; unknown cases become Fresh
            for tensor in self._tensors(out):
                with contextlib.suppress(Exception):
                    self._new(
                        tensor,
                        Fresh(
                            reason=f"unsupported by provenance tracking: {func}",
                            shape=tuple(tensor.shape),
                            dtype=_dtype(tensor),
                        ),
                    )
        return out

    @staticmethod
    def _tensors(value: Any) -> list[torch.Tensor]:
        return [t for t in leaves(value) if isinstance(t, torch.Tensor)]

    def _new(self, tensor: torch.Tensor, expr: Expr) -> None:
        self._records[_storage_key(tensor)] = StorageRecord(
            tensor.untyped_storage(), Region.of(tensor), _dtype(tensor), expr
        )

    def _site(self) -> SourceSite | None:
        return self._sites.site(skip=1)

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = func._schema.name.split("::")[-1]
        inplace = name.endswith("_") and not name.startswith("_")
        if func.is_view and not inplace:
            self._record_view_sites(out)
            return  # shares its input's storage: read through its region on demand
        if inplace:
            if args and isinstance(args[0], torch.Tensor):
                self._write(name, args[0], args, kwargs)
            return
        outputs = self._tensors(out)
        if not outputs:
            return
        site = self._site()
        for index, tensor in enumerate(outputs):
            expr = self._compute(name, args, kwargs, tensor, index, len(outputs), site)
            if isinstance(kwargs.get("out"), torch.Tensor):
                self._write_expr(kwargs["out"], expr, site)
            else:
                self._new(tensor, expr)

    def _record_view_sites(self, out: Any) -> None:
        views = [t for t in self._tensors(out) if _storage_key(t) in self._records]
        if not views:
            return
        site = self._site()
        for view in views:
            region = Region.of(view)
            self._view_sites[(_storage_key(view), region.offset, region.shape, region.stride)] = site

    def _write(self, op: str, target: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        key = _storage_key(target)
        record = self._records.get(key)
        shape, dtype = tuple(target.shape), _dtype(target)
        site = self._site()
        if record is None:
            record = StorageRecord(
                target.untyped_storage(),
                Region.of(target),
                dtype,
                Fresh(reason="created outside the traced builder", shape=shape, dtype=dtype),
            )
            self._records[key] = record
        if op == "copy_":
            source = args[1]
            expr = self._value(source)
            if tuple(source.shape) != shape:
                expr = ExpandOf(source=expr, shape=shape, dtype=expr.dtype, site=site)
            if expr.dtype != dtype:
                expr = CastOf(source=expr, shape=shape, dtype=dtype, site=site)
            expr = _with_site(expr, site)
        elif op in ("fill_", "zero_"):
            value = args[1] if op == "fill_" and len(args) > 1 else 0
            digest = constant_digest("full", repr(value), (), shape, dtype)
            zero = _all_zeros("full", (shape, value), {})  # as the factory `full(shape, value)` would be
            expr = Constant(digest=digest, description=f"full({value})", shape=shape, dtype=dtype, site=site, zero=zero)
        elif op in _RANDOM_INPLACE:
            expr = Fresh(reason=f"random initialisation ({op})", shape=shape, dtype=dtype, site=site)
        elif op in ("mul_", "div_") and _scalar_factor(args[1]) is not None:
            factor = _scalar_factor(args[1])
            assert factor is not None
            expr = ScaleOf(
                source=self.expr_of(target),
                factor=factor if op == "mul_" else 1 / factor,
                shape=shape,
                dtype=dtype,
                site=site,
            )
        else:
            expr = Opaque(op=op, sources=(self.expr_of(target),), shape=shape, dtype=dtype, site=site)
        self._write_expr(target, expr, site)

    def _write_expr(self, target: torch.Tensor, expr: Expr, site: SourceSite | None) -> None:
        record = self._records.get(_storage_key(target))
        if record is None:
            self._new(target, expr)
            return
        region = Region.of(target)
        box = decode(record.layout, region)
        if box is None or list(box.order) != sorted(box.order) or box.steps:
            record.write(
                Box((0,) * len(record.layout.shape), record.layout.shape, ()),
                Opaque(
                    op="write through a strided view",
                    sources=(record.content(), expr),
                    shape=record.layout.shape,
                    dtype=record.dtype,
                    site=site,
                ),
            )
            return
        box_shape = tuple(box.lengths)
        if tuple(expr.shape) != box_shape:
            expr = ViewOf(source=expr, shape=box_shape, dtype=expr.dtype, site=site)
        record.write(box, expr)

    def _value(self, value: Any) -> Expr:
        if isinstance(value, torch.Tensor):
            return self.expr_of(value)
        digest = constant_digest("scalar", repr(value), (), (), "scalar")
        return Constant(digest=digest, description=repr(value), shape=(), dtype="scalar")

    def _compute(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: torch.Tensor,
        index: int,
        n_outputs: int,
        site: SourceSite | None,
    ) -> Expr:
        shape, dtype = tuple(out.shape), _dtype(out)
        tensor_args = [a for a in leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        sources = tuple(self.expr_of(t) for t in tensor_args)
        if not tensor_args:
            if name in _RANDOM:
                return Fresh(reason=f"random values ({name})", shape=shape, dtype=dtype, site=site)
            if name in _UNINITIALISED:
                return Fresh(reason=f"uninitialised ({name})", shape=shape, dtype=dtype, site=site)
            attrs = _literal_attrs(args, kwargs)
            digest = constant_digest(name, attrs, (), shape, dtype)
            zero = _all_zeros(name, args, kwargs)
            return Constant(digest=digest, description=f"{name}{attrs}", shape=shape, dtype=dtype, site=site, zero=zero)
        if name in _UNINITIALISED:
            return Fresh(reason=f"uninitialised ({name})", shape=shape, dtype=dtype, site=site)
        if name in _RANDOM:
            return Fresh(reason=f"random values ({name})", shape=shape, dtype=dtype, site=site)
        if name in _IDENTITY or (name == "_to_copy" and sources[0].dtype == dtype):
            return (
                sources[0]
                if sources[0].shape == shape
                else ViewOf(source=sources[0], shape=shape, dtype=dtype, site=site)
            )
        if name == "_to_copy":
            return CastOf(source=sources[0], shape=shape, dtype=dtype, site=site)
        if name == "cat" and n_outputs == 1:
            parts = tuple(s for s in sources if math.prod(s.shape) > 0)
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if len(parts) == 1:
                return parts[0]
            return CatOf(parts=parts, dim=norm_dim(dim, len(shape)), shape=shape, dtype=dtype, site=site)
        if name == "stack" and n_outputs == 1:
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            dim = norm_dim(dim, len(shape))
            parts = []
            for s in sources:
                unsqueezed = list(s.shape)
                unsqueezed.insert(len(shape) + dim, 1)
                parts.append(ViewOf(source=s, shape=tuple(unsqueezed), dtype=dtype, site=site))
            return CatOf(parts=tuple(parts), dim=dim, shape=shape, dtype=dtype, site=site)
        if (
            name in ("mul", "div")
            and len(tensor_args) == 1
            and len(args) >= 2
            and not isinstance(args[1], torch.Tensor)
        ):
            factor = _scalar_factor(args[1])
            if factor is not None and factor != 0:
                return ScaleOf(
                    source=sources[0],
                    factor=factor if name == "mul" else 1 / factor,
                    shape=shape,
                    dtype=dtype,
                    site=site,
                )
        if name == "neg":
            return ScaleOf(source=sources[0], factor=Fraction(-1), shape=shape, dtype=dtype, site=site)
        if all(is_deterministic(s) for s in sources):
            attrs = _literal_attrs(args, kwargs)
            digest = constant_digest(f"{name}#{index}", attrs, sources, shape, dtype)
            return Constant(digest=digest, description=f"{name}(...) of constants", shape=shape, dtype=dtype, site=site)
        return Opaque(op=name, sources=sources, shape=shape, dtype=dtype, site=site)


def _with_site(expr: Expr, site: SourceSite | None) -> Expr:
    """Attach the site of the write (the loader line) when the value itself has none."""
    if expr.site is not None or site is None:
        return expr
    import dataclasses

    return dataclasses.replace(expr, site=site)


def _literal_attrs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    def literal(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return "<tensor>"
        if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
            return str(value)
        return value

    flat = [literal(a) for a in tree_flatten(args)[0]]
    named = {k: literal(v) for k, v in kwargs.items() if k not in ("device", "pin_memory")}
    return repr((flat, sorted(named.items())))


@contextlib.contextmanager
def tracking(tracker: ProvenanceTracker) -> Iterator[ProvenanceTracker]:
    with tracker:
        yield tracker
