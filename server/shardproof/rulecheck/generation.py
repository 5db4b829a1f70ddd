"""Random values for one instance of a rule (what an instance recipe draws from), and the measures
a partial-sum or partial-max instance splits a value into."""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import meaning


class RecipeError(Exception):
    """The instance recipe is wrong (it binds too little, or its instance does not match the rule)."""


@dataclass
class Measure:
    """A value split into K contributions along a reduced index (what a partial-sum fact is about,
    or with `combine` "max" a partial-max fact)."""

    parts: torch.Tensor  # [K, *shape]
    combine: str = "sum"

    @property
    def size(self) -> int:
        return self.parts.shape[0]

    def part(self, start: int, end: int) -> torch.Tensor:
        return combine(self.combine, self.parts[start:end])

    def part_of(self, selected: list[int]) -> torch.Tensor:
        """The contribution of the listed indices (with their multiplicity)."""
        if not selected:
            return torch.zeros_like(self.parts[0])
        return combine(self.combine, self.parts[selected])


def combine(kind: str, parts: Any) -> torch.Tensor:
    """The sum or the max of stacked (or listed) contributions."""
    stacked = parts if isinstance(parts, torch.Tensor) else torch.stack(list(parts))
    return stacked.amax(0) if kind == "max" else stacked.sum(0)


@dataclass
class Gen:
    """Random values for one instance: shared by the ranks of a world, so their reference values agree."""

    rule: str
    trial: int
    world: int
    rank: int
    random: random.Random = field(init=False)
    generator: torch.Generator = field(init=False)
    measures: dict[int, Measure] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seed = zlib.crc32(f"{self.rule}/{self.trial}/{self.world}".encode())
        self.random = random.Random(seed)
        self.generator = torch.Generator().manual_seed(seed)

    def int(self, low: int, high: int) -> int:
        return self.random.randint(low, high)

    def pick(self, options: Any) -> Any:
        return self.random.choice(list(options))

    def tensor(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, dtype=torch.float64, generator=self.generator)

    def ids(self, shape: tuple[int, ...], vocab: int) -> torch.Tensor:
        return torch.randint(0, vocab, shape, generator=self.generator)

    def mask(self, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator) < 0.4

    def tiles(self, n: int, parts: int | None = None) -> list[tuple[int, int]]:
        """An uneven tiling of [0, n) into `parts` (default: the world size) non-empty pieces."""
        parts = self.world if parts is None else parts
        if n < parts:
            raise RecipeError(f"cannot tile {n} indices over {parts} ranks")
        cuts = sorted(self.random.sample(range(1, n), parts - 1))
        edges = [0, *cuts, n]
        return list(itertools.pairwise(edges))

    def tile(self, n: int) -> tuple[int, int]:
        """This rank's piece of a tiling of [0, n)."""
        return self.tiles(n)[self.rank]

    def even_tile(self, n: int, block: int = 1) -> tuple[int, int]:
        """This rank's piece of an even split of n blocks of `block` indices."""
        if n % self.world:
            raise RecipeError(f"{n} blocks do not split evenly over {self.world} ranks")
        share = n // self.world * block
        return self.rank * share, (self.rank + 1) * share

    def ranges(self, ranges: list[tuple[int, int]]) -> tuple:
        return meaning.range_list(ranges)

    def selection(self, n: int, most: int = 3) -> tuple:
        """Some disjoint, non-empty ranges of [0, n), in any order (a shard, or fused pieces)."""
        count = self.int(1, min(most, n))
        edges = sorted(self.random.sample(range(n + 1), 2 * count)) if 2 * count <= n + 1 else [0, n]
        pieces = [(edges[i], edges[i + 1]) for i in range(0, len(edges) - 1, 2) if edges[i] < edges[i + 1]]
        self.random.shuffle(pieces)
        return meaning.range_list(pieces or [(0, n)])

    def contributions(self, shape: tuple[int, ...], size: int, kind: str = "sum") -> Measure:
        return Measure(torch.randn(size, *shape, dtype=torch.float64, generator=self.generator), kind)

    def total(self, measure: Measure) -> torch.Tensor:
        """The value a measure adds up to (registered, so partial-sum premises about it can be checked)."""
        total = measure.part(0, measure.size)
        self.measures[id(total)] = measure
        return total

    @staticmethod
    def text(values: Any) -> str:
        return ",".join(str(v) for v in values)


Recipe = Callable[[Gen], "dict[str, Any] | None"]
