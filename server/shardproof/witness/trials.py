"""Which numbers the witness tries before it says "the numbers agree".

A mistake in parallel code often hides from one random run: an off-by-one vocabulary bound shows
only for the ids at the bound, a mask only for ids outside a rank's range, a wrong scale only in
magnitudes where it is not lost in rounding. So every seed of random weights runs several inputs:
the example inputs, token ids at every vocabulary shard boundary, token ids at the values the
programs compare against (a rank's `ids >= start`, `ids < end`: each bound, one below and one
above), a random draw, and floating inputs of larger magnitude.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..graph.model import Graph

# Random weights the witness draws, one build of every rank each; the first differing seed stops it.
SEEDS = (0, 1, 2)
LARGE_MAGNITUDE = 100.0
_COMPARISONS = {"lt", "le", "gt", "ge", "eq", "ne", "rlt", "rle", "rgt", "rge", "req", "rne"}


def compared_constants(graphs: Iterable[Graph]) -> list[int]:
    """The integers the programs compare values against (`x >= 32`, `x < 64`): where a bound
    that is off by one shows, for the witness to try."""
    found: set[int] = set()
    for graph in graphs:
        for node in graph.nodes:
            value = node.attrs.get("value")
            compared = node.op == "scalar" and node.attrs.get("fn") in _COMPARISONS
            if compared and isinstance(value, int) and not isinstance(value, bool):
                found.add(value)
    return sorted(found)


def vocabulary_size(reference: nn.Module) -> int:
    """The largest embedding table of the model (nn.Embedding and the libraries' vocabulary-parallel
    embeddings, whole at world size 1), or 0."""
    sizes = (getattr(m, "num_embeddings", None) for m in reference.modules())
    return max((size for size in sizes if isinstance(size, int)), default=0)


def shard_boundaries(vocab: int, world_size: int) -> set[int]:
    """The first and last id of every rank's block, for even splits (floor) and for ceil-division
    splits with a short last rank, and the last id of the vocabulary."""
    edges = {0, vocab - 1}
    ceil = -(-vocab // world_size)
    for k in range(1, world_size):
        for edge in (k * vocab // world_size, k * ceil):
            edges.update({edge - 1, edge})
    return {e for e in edges if 0 <= e < vocab}


def input_trials(
    reference: nn.Module,
    inputs: tuple[Any, ...],
    world_size: int,
    seed: int,
    compared: Iterable[int] = (),
) -> list[tuple[str, Any]]:
    """The inputs one seed runs, each with a description: the example inputs first."""
    vocab = vocabulary_size(reference)
    generator = torch.Generator().manual_seed(seed + 1)
    trials: list[tuple[str, Any]] = [("the example inputs", inputs)]

    def ids_from(values: list[int]) -> Any:
        def fill(tensor: torch.Tensor) -> torch.Tensor:
            chosen = torch.tensor(values, dtype=tensor.dtype)
            flat = torch.randint(0, vocab, (tensor.numel(),), generator=generator, dtype=tensor.dtype)
            flat[: min(len(chosen), flat.numel())] = chosen[: flat.numel()]
            return flat.reshape(tensor.shape)

        return fill

    def random_ids(tensor: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, vocab, tensor.shape, generator=generator, dtype=tensor.dtype)

    if vocab:
        boundaries = sorted(shard_boundaries(vocab, world_size))
        trials.append(("token ids at every vocabulary shard boundary", _replace(inputs, vocab, ids_from(boundaries))))
        near = sorted({v + d for v in compared for d in (-1, 0, 1)} - set(boundaries))
        near = [v for v in near if 0 <= v < vocab]
        if near:
            shown = ", ".join(map(str, near[:8])) + (", ..." if len(near) > 8 else "")
            description = f"token ids at the values the programs compare against ({shown})"
            trials.append((description, _replace(inputs, vocab, ids_from(near))))
    trials.append(("random inputs", _replace(inputs, vocab, random_ids, generator)))
    if _has_floating(inputs):
        scaled = f"random inputs of larger magnitude (x{LARGE_MAGNITUDE:g})"
        trials.append((scaled, _replace(inputs, vocab, random_ids, generator, LARGE_MAGNITUDE)))
    return trials


def _has_floating(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    if isinstance(value, list | tuple):
        return any(_has_floating(v) for v in value)
    if isinstance(value, dict):
        return any(_has_floating(v) for v in value.values())
    return False


def _replace(
    value: Any, vocab: int, ids: Any, generator: torch.Generator | None = None, scale: float | None = None
) -> Any:
    """`value` with its token-id tensors replaced by `ids(tensor)` and, with a generator, its
    floating tensors by random values (times `scale`); anything else is kept."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            if generator is None:
                return value
            drawn = torch.randn(value.shape, generator=generator, dtype=value.dtype)
            return drawn * scale if scale is not None else drawn
        is_ids = value.dtype in (torch.int64, torch.int32) and value.numel() and int(value.min()) >= 0
        if vocab and is_ids and int(value.max()) < vocab:
            return ids(value)
        return value
    if isinstance(value, list | tuple):
        return type(value)(_replace(v, vocab, ids, generator, scale) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, vocab, ids, generator, scale) for k, v in value.items()}
    return value
