"""The relation a rank's value is assumed to have to the reference's, from their shapes alone.

Where a proof is cut (a value crossing between the parts of a world size, the inputs of a block
proven once for all its instances), the rank's value is assumed to be the reference's value when
their shapes agree, or the rank's block of the one dimension where they differ (rank r holds
block r mod k of the k equal blocks: sequence parallelism). Whatever assumes it must have it
proven where the value is computed; an assumption that does not hold is never proven there, so
it costs completeness, never soundness.
"""

from __future__ import annotations

from ..graph.model import TensorMeta

# (dim, start, end), the dim negative: the rank's value is the reference's [..., start:end, ...]
Shard = tuple[int, int, int]


class Unrelated(ValueError):
    """No relation fits the two shapes (another dtype or rank, several differing dims, a size that
    does not divide the reference's)."""


def assumed_shard(reference: TensorMeta, own: TensorMeta, rank: int | None) -> Shard | None:
    """None when the rank's value is assumed equal to the reference's, else the block it holds."""
    if own.dtype != reference.dtype or own.ndim != reference.ndim:
        raise Unrelated(f"{own} against {reference}")
    differing = [d for d, (a, b) in enumerate(zip(reference.shape, own.shape, strict=True)) if a != b]
    if not differing:
        return None
    if len(differing) != 1 or rank is None:
        raise Unrelated(f"{own.shape} against {reference.shape}")
    dim = differing[0]
    full, size = reference.shape[dim], own.shape[dim]
    if size == 0 or full % size:
        raise Unrelated(f"{own.shape} against {reference.shape}")
    start = (rank % (full // size)) * size
    return (dim - own.ndim, start, start + size)
