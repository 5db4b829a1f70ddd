"""How a rank's parameter or buffer was made from the reference's: provenance expressions.

The capture stage records, for every tensor the `parallel` builder creates, an expression over
the reference's parameters built from data movement only (slices, concatenation, views,
permutations, scaling by a constant, dtype casts). A rank parameter whose expression has no
`Fresh` or `Opaque` leaf is a known function of the reference weights; the verifier uses the
expression as that parameter's value. Deterministically computed tensors (rotary tables made
from `arange`) are `Constant`s identified by a digest of their construction, so a rank that
recomputes a reference buffer with the same code gets the same constant.

All dims are negative (counted from the last dimension). Expressions compare structurally;
the source site is carried along but excluded from equality.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..graph.model import SourceSite


@dataclass(frozen=True, kw_only=True)
class _Base:
    shape: tuple[int, ...]
    dtype: str
    site: SourceSite | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True, kw_only=True)
class ParamRef(_Base):
    """A reference parameter or buffer, by fully qualified name."""

    name: str


@dataclass(frozen=True, kw_only=True)
class Constant(_Base):
    """A deterministic value: a factory call or deterministic ops over other constants."""

    digest: str
    description: str = field(default="", compare=False)
    zero: bool = field(default=False, compare=False)  # made as zeros (`zeros`, `full(0)`, `zero_()`)


@dataclass(frozen=True, kw_only=True)
class Fresh(_Base):
    """Values not derived from the reference: uninitialised, random, or from untraced code."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class Opaque(_Base):
    """Derived from the reference by an operation the relation language cannot express."""

    op: str
    sources: tuple[Expr, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SliceOf(_Base):
    source: Expr
    dim: int
    start: int
    end: int


@dataclass(frozen=True, kw_only=True)
class CatOf(_Base):
    parts: tuple[Expr, ...]
    dim: int


@dataclass(frozen=True, kw_only=True)
class ViewOf(_Base):
    source: Expr


@dataclass(frozen=True, kw_only=True)
class PermuteOf(_Base):
    source: Expr
    perm: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ScaleOf(_Base):
    source: Expr
    factor: Fraction


@dataclass(frozen=True, kw_only=True)
class CastOf(_Base):
    source: Expr


@dataclass(frozen=True, kw_only=True)
class ExpandOf(_Base):
    source: Expr


Expr = ParamRef | Constant | Fresh | Opaque | SliceOf | CatOf | ViewOf | PermuteOf | ScaleOf | CastOf | ExpandOf


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, CatOf):
        return expr.parts
    if isinstance(expr, Opaque):
        return expr.sources
    source = getattr(expr, "source", None)
    return (source,) if source is not None else ()


def leaves(expr: Expr) -> list[Expr]:
    kids = children(expr)
    if not kids or isinstance(expr, Opaque):
        return [expr]
    out: list[Expr] = []
    for kid in kids:
        out.extend(leaves(kid))
    return out


def problems(expr: Expr) -> list[Fresh | Opaque]:
    """Leaves that make this expression unrelated to the reference."""
    return [leaf for leaf in leaves(expr) if isinstance(leaf, Fresh | Opaque)]


def is_deterministic(expr: Expr) -> bool:
    """True when the value depends on nothing but literals (a recomputable constant)."""
    return all(isinstance(leaf, Constant) for leaf in leaves(expr)) and not any(
        isinstance(e, Opaque) for e in _walk(expr)
    )


def _walk(expr: Expr) -> list[Expr]:
    out = [expr]
    for kid in children(expr):
        out.extend(_walk(kid))
    return out


def referenced_params(expr: Expr) -> set[str]:
    return {leaf.name for leaf in leaves(expr) if isinstance(leaf, ParamRef)}


def constant_digest(op: str, attrs: Any, inputs: tuple[Expr, ...], shape: tuple[int, ...], dtype: str) -> str:
    text = repr((op, attrs, tuple(_identity(i) for i in inputs), shape, dtype))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _identity(expr: Expr) -> str:
    if isinstance(expr, Constant):
        return "c:" + expr.digest
    return repr(expr)


def norm_dim(dim: int, ndim: int) -> int:
    """Negative form of a dim: -1 is the last dimension."""
    if ndim == 0:
        return -1
    if not -ndim <= dim < ndim:
        raise ValueError(f"dim {dim} out of range for {ndim} dims")
    return dim - ndim if dim >= 0 else dim


def describe(expr: Expr) -> str:
    """A short human-readable rendering, e.g. `cat(wqkv.weight[0:64], wqkv.weight[128:160])`."""
    if isinstance(expr, ParamRef):
        return expr.name
    if isinstance(expr, Constant):
        return expr.description or f"constant {expr.digest[:8]}"
    if isinstance(expr, Fresh):
        return f"<{expr.reason}>"
    if isinstance(expr, Opaque):
        return f"{expr.op}({', '.join(describe(s) for s in expr.sources)})"
    if isinstance(expr, SliceOf):
        nd = len(expr.source.shape)
        index = [":"] * nd
        index[nd + expr.dim] = f"{expr.start}:{expr.end}"
        return f"{describe(expr.source)}[{', '.join(index)}]"
    if isinstance(expr, CatOf):
        return f"cat([{', '.join(describe(p) for p in expr.parts)}], dim={expr.dim})"
    if isinstance(expr, ViewOf):
        return f"{describe(expr.source)}.view{expr.shape}"
    if isinstance(expr, PermuteOf):
        return f"{describe(expr.source)}.permute{expr.perm}"
    if isinstance(expr, ScaleOf):
        return f"({describe(expr.source)} * {expr.factor})"
    if isinstance(expr, CastOf):
        return f"{describe(expr.source)}.to({expr.dtype})"
    if isinstance(expr, ExpandOf):
        return f"{describe(expr.source)}.expand{expr.shape}"
    raise TypeError(expr)
