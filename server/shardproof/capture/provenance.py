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
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    PermuteOf,
    ScaleOf,
    SliceOf,
    ViewOf,
    constant_digest,
    is_deterministic,
    norm_dim,
)
from .frames import LiveSites
from .lowering_tables import _all_zeros
from .meta_ops import leaves

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


@dataclass
class _Region:
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @staticmethod
    def of(tensor: torch.Tensor) -> _Region:
        return _Region(tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))


@dataclass
class _Box:
    """A region decoded against a storage's layout: per layout dim start/length, plus the order
    in which the region's non-unit dims walk the layout dims."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    order: tuple[int, ...]  # layout dims in the region's dim order (non-unit region dims only)
    steps: tuple[int, ...] = ()  # per layout dim, the step between the elements taken (none: all 1)

    def step(self, d: int) -> int:
        return self.steps[d] if self.steps else 1


def _decode(layout: _Region, region: _Region) -> _Box | None:
    """Express `region` as a box of `layout` (both strided views of one storage), or None."""
    relative = region.offset - layout.offset
    if relative < 0:
        return None
    dims = sorted(range(len(layout.shape)), key=lambda d: -layout.stride[d])
    starts = [0] * len(layout.shape)
    for d in dims:
        if layout.shape[d] == 1 or layout.stride[d] == 0:
            continue
        starts[d], relative = divmod(relative, layout.stride[d])
    if relative != 0:
        return None
    lengths = [1] * len(layout.shape)
    steps = [1] * len(layout.shape)
    order: list[int] = []
    used: set[int] = set()
    for size, stride in zip(region.shape, region.stride, strict=True):
        if size == 1:
            continue
        free = [d for d in range(len(layout.shape)) if d not in used and layout.shape[d] > 1]
        match = [d for d in free if layout.stride[d] == stride]
        if not match and stride > 0:
            # every k-th element of one dim (`W[rank::world_size]`): the dim of the largest stride
            # that divides the region's, taken with that step
            steppable = [d for d in free if layout.stride[d] > 0 and stride % layout.stride[d] == 0]
            match = sorted(steppable, key=lambda d: -layout.stride[d])
        if not match:
            return None
        d = match[0]
        used.add(d)
        lengths[d] = size
        steps[d] = stride // layout.stride[d]
        order.append(d)
    for d in range(len(layout.shape)):
        if starts[d] + (lengths[d] - 1) * steps[d] + 1 > layout.shape[d]:
            return None
    return _Box(tuple(starts), tuple(lengths), tuple(order), tuple(steps) if any(k > 1 for k in steps) else ())


def _row_major(region: _Region) -> bool:
    """Whether the region's elements are consecutive in row-major order (unit dims have any stride)."""
    expected = 1
    for size, step in zip(reversed(region.shape), reversed(region.stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def _refined(layout: _Region, region: _Region) -> _Region | None:
    """`layout` with its dims split where the region's strides fall inside them, so that each of the
    region's dims walks one dim of it (a weight viewed as (parts, heads, head_dim, hidden) and
    narrowed to some heads: in the weight's rows, runs of rows a period apart), or None.

    A layout dim of stride S and size L is split at the strides of the region dims that fall in
    it (multiples of S below S * L): into (S L / s1, s1 / s2, ..., sk / S), each a divisor of the
    one before. Only the strides are cut points, not where a region dim's run ends, so a run of
    consecutive rows stays one slice of one dim (the form the selection rules follow)."""
    shape: list[int] = []
    stride: list[int] = []
    for size, step in zip(layout.shape, layout.stride, strict=True):
        if size == 1 or step == 0:
            shape.append(size)
            stride.append(step)
            continue
        top = step * size
        cuts = sorted(
            {top, step}
            | {
                s
                for n, s in zip(region.shape, region.stride, strict=True)
                if n > 1 and step < s < top and s % step == 0
            },
            reverse=True,
        )
        for above, below in itertools.pairwise(cuts):
            if above % below:
                return None
            shape.append(above // below)
            stride.append(below)
    if len(shape) == len(layout.shape):
        return None  # nothing split: the plain decoding already said no
    return _Region(layout.offset, tuple(shape), tuple(stride))


def _read_box(
    content: Expr,
    layout_shape: tuple[int, ...],
    box: _Box,
    out_shape: tuple[int, ...],
    dtype: str,
    site: SourceSite | None,
) -> Expr:
    expr = content
    nd = len(layout_shape)
    for d in range(nd):
        if box.step(d) > 1:
            expr = _read_every_kth(expr, d, box.starts[d], box.lengths[d], box.step(d), dtype, site)
            if expr is None:
                return Opaque(op="strided view", sources=(content,), shape=out_shape, dtype=dtype, site=site)
        elif box.lengths[d] != layout_shape[d]:
            sliced_shape = tuple(box.lengths[k] if k == d else expr.shape[k] for k in range(nd))
            expr = SliceOf(
                source=expr,
                dim=d - nd,
                start=box.starts[d],
                end=box.starts[d] + box.lengths[d],
                shape=sliced_shape,
                dtype=dtype,
                site=site,
            )
    if list(box.order) != sorted(box.order):
        # Bring the mapped dims into the region's order; unit dims keep their places.
        perm = list(range(nd))
        mapped_positions = sorted(box.order)
        for position, d in zip(mapped_positions, box.order, strict=True):
            perm[position] = d
        permuted_shape = tuple(expr.shape[p] for p in perm)
        expr = PermuteOf(source=expr, perm=tuple(perm), shape=permuted_shape, dtype=dtype, site=site)
    if tuple(expr.shape) != tuple(out_shape):
        expr = ViewOf(source=expr, shape=tuple(out_shape), dtype=dtype, site=site)
    return expr


def _read_every_kth(
    expr: Expr, d: int, start: int, length: int, step: int, dtype: str, site: SourceSite | None
) -> Expr | None:
    """Elements start, start + step, ... (length of them) of dim d, as data movement the rules
    follow: the span of whole groups of `step` is split into (length, step), the offset within a
    group is sliced and the unit dim merged away. None when the last group runs past the dim."""
    nd = len(expr.shape)
    base, offset = start - start % step, start % step
    if base + length * step > expr.shape[d]:
        return None

    def shaped(dim_sizes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(expr.shape[:d]) + dim_sizes + tuple(expr.shape[d + 1 :])

    if (base, base + length * step) != (0, expr.shape[d]):
        span = shaped((length * step,))
        end = base + length * step
        expr = SliceOf(source=expr, dim=d - nd, start=base, end=end, shape=span, dtype=dtype, site=site)
    grouped = ViewOf(source=expr, shape=shaped((length, step)), dtype=dtype, site=site)
    within = d + 1 - (nd + 1)  # the step's dim, negative
    picked = SliceOf(
        source=grouped, dim=within, start=offset, end=offset + 1, shape=shaped((length, 1)), dtype=dtype, site=site
    )
    return ViewOf(source=picked, shape=shaped((length,)), dtype=dtype, site=site)


@dataclass
class _Write:
    box: _Box
    expr: Expr  # already in layout dim order, shaped like the box


@dataclass
class _StorageRecord:
    storage: Any  # keeps the storage alive so its key is never reused while tracking
    layout: _Region
    dtype: str
    initial: Expr
    writes: list[_Write] = field(default_factory=list)
    _content: Expr | None = None

    def content(self) -> Expr:
        if self._content is None:
            self._content = _apply_writes(self)
        return self._content

    def write(self, box: _Box, expr: Expr) -> None:
        self.writes.append(_Write(box, expr))
        self._content = None


def _is_full(box: _Box, shape: tuple[int, ...]) -> bool:
    return all(s == 0 and n == full for s, n, full in zip(box.starts, box.lengths, shape, strict=True))


def _apply_writes(record: _StorageRecord) -> Expr:
    shape = record.layout.shape
    nd = len(shape)
    writes = list(record.writes)
    base: Expr = record.initial
    for index in range(len(writes) - 1, -1, -1):
        if _is_full(writes[index].box, shape):
            base = writes[index].expr
            writes = writes[index + 1 :]
            break
    if not writes:
        return base
    partial_dims = {d for w in writes for d in range(nd) if w.box.lengths[d] != shape[d]}
    if len(partial_dims) != 1:
        site = writes[-1].expr.site
        return Opaque(
            op="writes into several dimensions",
            sources=(base, *[w.expr for w in writes]),
            shape=shape,
            dtype=record.dtype,
            site=site,
        )
    (d,) = partial_dims
    # Segments along d: (start, end, expr, expr_start) where expr covers [expr_start, ...).
    segments: list[tuple[int, int, Expr, int]] = [(0, shape[d], base, 0)]
    for w in writes:
        start, end = w.box.starts[d], w.box.starts[d] + w.box.lengths[d]
        updated: list[tuple[int, int, Expr, int]] = []
        for s, e, ex, ex_start in segments:
            if e <= start or s >= end:
                updated.append((s, e, ex, ex_start))
                continue
            if s < start:
                updated.append((s, start, ex, ex_start))
            if e > end:
                updated.append((end, e, ex, ex_start))
        updated.append((start, end, w.expr, start))
        segments = sorted(updated, key=lambda seg: seg[0])
    parts: list[Expr] = []
    for s, e, ex, ex_start in segments:
        if s == ex_start and e - s == ex.shape[d]:
            parts.append(ex)
        else:
            part_shape = tuple(e - s if k == d else shape[k] for k in range(nd))
            parts.append(
                SliceOf(
                    source=ex,
                    dim=d - nd,
                    start=s - ex_start,
                    end=e - ex_start,
                    shape=part_shape,
                    dtype=record.dtype,
                    site=ex.site,
                )
            )
    if len(parts) == 1:
        return parts[0]
    return CatOf(parts=tuple(parts), dim=d - nd, shape=shape, dtype=record.dtype, site=writes[-1].expr.site)


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
        self._records: dict[int, _StorageRecord] = {}
        # Views share their input's storage and are read through their region on demand; the
        # site that made each view is kept so a slice points at the line that took it.
        self._view_sites: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], SourceSite | None] = {}
        self._sites = LiveSites()

    # -- public API -------------------------------------------------------------------------
    def register(self, tensor: torch.Tensor, expr: Expr) -> None:
        """Declare the content of `tensor`'s storage (used for reference parameters)."""
        self._records[_storage_key(tensor)] = _StorageRecord(
            tensor.untyped_storage(), _Region.of(tensor), _dtype(tensor), expr
        )

    def expr_of(self, tensor: torch.Tensor) -> Expr:
        record = self._records.get(_storage_key(tensor))
        if record is None:
            return Fresh(reason="created outside the traced builder", shape=tuple(tensor.shape), dtype=_dtype(tensor))
        region = _Region.of(tensor)
        if region == record.layout:
            return record.content()
        site = self._view_sites.get((_storage_key(tensor), region.offset, region.shape, region.stride))
        whole = region.offset == record.layout.offset and math.prod(region.shape) == math.prod(record.layout.shape)
        if whole and _row_major(record.layout) and _row_major(region):
            # the whole of a contiguous storage read in another shape (a reshape that merges dims)
            content = record.content()
            source = content.source if isinstance(content, ViewOf) else content  # one view of a view
            if tuple(source.shape) == tuple(region.shape):  # viewed back to its own shape: itself
                return source
            return ViewOf(source=source, shape=region.shape, dtype=_dtype(tensor), site=site)
        box = _decode(record.layout, region)
        content, layout_shape = record.content(), record.layout.shape
        if box is None:
            refined = _refined(record.layout, region)
            box = _decode(refined, region) if refined is not None else None
            if box is not None and refined is not None:
                content = ViewOf(source=content, shape=refined.shape, dtype=_dtype(tensor), site=site)
                layout_shape = refined.shape
        if box is None:
            return Opaque(
                op="strided view",
                sources=(record.content(),),
                shape=tuple(tensor.shape),
                dtype=_dtype(tensor),
                site=site,
            )
        return _read_box(content, layout_shape, box, tuple(tensor.shape), _dtype(tensor), site)

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
        self._records[_storage_key(tensor)] = _StorageRecord(
            tensor.untyped_storage(), _Region.of(tensor), _dtype(tensor), expr
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
            region = _Region.of(view)
            self._view_sites[(_storage_key(view), region.offset, region.shape, region.stride)] = site

    def _write(self, op: str, target: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        key = _storage_key(target)
        record = self._records.get(key)
        shape, dtype = tuple(target.shape), _dtype(target)
        site = self._site()
        if record is None:
            record = _StorageRecord(
                target.untyped_storage(),
                _Region.of(target),
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
        region = _Region.of(target)
        box = _decode(record.layout, region)
        if box is None or list(box.order) != sorted(box.order) or box.steps:
            record.write(
                _Box((0,) * len(record.layout.shape), record.layout.shape, ()),
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
