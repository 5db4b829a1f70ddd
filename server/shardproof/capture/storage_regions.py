"""A storage's content as the provenance tracker keeps it: the layout a storage was made with,
the in-place writes into regions of it (`copy_` into a slice), and any tensor's value read back
through its strided region (a slice, a permutation, a view of the content), or `Opaque` when no
box of the layout is that region."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from ..graph.model import SourceSite
from ..relations.expr import CatOf, Expr, Opaque, PermuteOf, SliceOf, ViewOf


@dataclass
class Region:
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @staticmethod
    def of(tensor: torch.Tensor) -> Region:
        return Region(tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))


@dataclass
class Box:
    """A region decoded against a storage's layout: per layout dim start/length, plus the order
    in which the region's non-unit dims walk the layout dims."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    order: tuple[int, ...]  # layout dims in the region's dim order (non-unit region dims only)
    steps: tuple[int, ...] = ()  # per layout dim, the step between the elements taken (none: all 1)

    def step(self, d: int) -> int:
        return self.steps[d] if self.steps else 1


def decode(layout: Region, region: Region) -> Box | None:
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
    return Box(tuple(starts), tuple(lengths), tuple(order), tuple(steps) if any(k > 1 for k in steps) else ())


def row_major(region: Region) -> bool:
    """Whether the region's elements are consecutive in row-major order (unit dims have any stride)."""
    expected = 1
    for size, step in zip(reversed(region.shape), reversed(region.stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def refined(layout: Region, region: Region) -> Region | None:
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
    return Region(layout.offset, tuple(shape), tuple(stride))


def read_box(
    content: Expr,
    layout_shape: tuple[int, ...],
    box: Box,
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
    box: Box
    expr: Expr  # already in layout dim order, shaped like the box


@dataclass
class StorageRecord:
    storage: Any  # keeps the storage alive so its key is never reused while tracking
    layout: Region
    dtype: str
    initial: Expr
    writes: list[_Write] = field(default_factory=list)
    _content: Expr | None = None

    def content(self) -> Expr:
        if self._content is None:
            self._content = _apply_writes(self)
        return self._content

    def write(self, box: Box, expr: Expr) -> None:
        self.writes.append(_Write(box, expr))
        self._content = None


def _is_full(box: Box, shape: tuple[int, ...]) -> bool:
    return all(s == 0 and n == full for s, n, full in zip(box.starts, box.lengths, shape, strict=True))


def _apply_writes(record: StorageRecord) -> Expr:
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
