"""Relations of a rank's tensors when the parallel program is the reference's own code at another
world size (`same_code_reference`), and the relations a declaration states explicitly."""

from __future__ import annotations

from fractions import Fraction

from ..config import declared_blocks, declared_dim, declared_shard, same_code_sharded_dim
from ..relations.expr import CatOf, Expr, ScaleOf, SliceOf


def same_code_relation(own: Expr, shape: tuple[int, ...], reference: Expr | None, rank: int, world_size: int) -> Expr:
    """A rank tensor of the same code as the world-size-1 reference: the reference tensor of the
    same name when the shapes agree, the rank's contiguous block along the one dim that is
    world_size times smaller (fairscale's and Megatron's layout), else what the builder made."""
    if reference is None:
        return own
    if reference.shape == shape:
        return reference
    dim = same_code_sharded_dim(shape, reference.shape, world_size)
    return own if dim is None else _rank_block(reference, dim, shape, rank, world_size)


def declared_relation(expr: Expr, relation: str, reference: Expr, rank: int, world_size: int) -> Expr:
    """An explicit relation from the declaration, for shards the builder initialises itself."""
    if relation == "replicated":
        return reference
    if relation == "share":
        return ScaleOf(source=reference, factor=Fraction(1, world_size), shape=reference.shape, dtype=reference.dtype)
    if relation.startswith("packed-shard:"):
        nd = len(reference.shape)
        dim = declared_dim(relation)
        dim = dim - nd if dim >= 0 else dim
        pieces = []
        for start, end in declared_blocks(relation, reference.shape[dim], rank, world_size):
            shape = list(reference.shape)
            shape[dim] = end - start
            pieces.append(
                SliceOf(source=reference, dim=dim, start=start, end=end, shape=tuple(shape), dtype=reference.dtype)
            )
        return CatOf(parts=tuple(pieces), dim=dim, shape=expr.shape, dtype=reference.dtype)
    return _rank_block(reference, declared_dim(relation), expr.shape, rank, world_size)


def _rank_block(reference: Expr, dim: int, shape: tuple[int, ...], rank: int, world_size: int) -> SliceOf:
    """Rank `rank`'s contiguous block of `reference` along `dim` (the layout `shard:<dim>` declares)."""
    nd = len(reference.shape)
    dim = dim - nd if dim >= 0 else dim
    start, end = declared_shard(reference.shape[nd + dim], rank, world_size)
    return SliceOf(source=reference, dim=dim, start=start, end=end, shape=shape, dtype=reference.dtype)
