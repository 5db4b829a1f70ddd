"""The numeric witness's ranks reduce-scatter with every reduction, in every layout, and reduce to
one rank: on concrete tensors, each rank's result is the collective's definition computed here
from every rank's input (the threaded process group's own reduce-scatter knows SUM and AVG only)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from shardproof.witness.numeric import run_ranks

# the definition of each reduction over the ranks' values, stacked along dim 0
DEFINITIONS = {
    "SUM": lambda stacked: stacked.sum(0),
    "AVG": lambda stacked: stacked.mean(0),
    "MAX": lambda stacked: stacked.amax(0),
    "MIN": lambda stacked: stacked.amin(0),
    "PRODUCT": lambda stacked: stacked.prod(0),
}


def _value_of(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)


def _on_every_rank(world_size: int, run) -> list:
    """`run(rank)` on every rank of the witness's threaded process group; what each returned."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reduce_scatter_tensor's deprecation
        return run_ranks(
            [nn.Identity() for _ in range(world_size)],
            lambda copy, rank, size: copy,
            world_size,
            lambda name: None,
            lambda module, rank: run(rank),
        )


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("op", list(DEFINITIONS))
def test_reduce_scatter_tensor_is_the_reduction_of_each_ranks_block(op: str, world_size: int) -> None:
    shape = (2 * world_size, 3)

    def run(rank: int) -> torch.Tensor:
        output = torch.empty(2, 3, dtype=torch.float64)
        dist.reduce_scatter_tensor(output, _value_of(rank, shape), op=getattr(dist.ReduceOp, op))
        return output

    outputs = _on_every_rank(world_size, run)
    full = DEFINITIONS[op](torch.stack([_value_of(r, shape) for r in range(world_size)]))
    for rank, output in enumerate(outputs):
        assert torch.equal(output, full.chunk(world_size)[rank]), (op, rank)


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_scatter_tensor_of_the_stacked_form(op: str) -> None:
    """The input stacked as [world_size, *output.shape]: rank r's output reduces entry r."""
    world_size = 2

    def run(rank: int) -> torch.Tensor:
        output = torch.empty(2, 3, dtype=torch.float64)
        dist.reduce_scatter_tensor(output, _value_of(rank, (world_size, 2, 3)), op=getattr(dist.ReduceOp, op))
        return output

    outputs = _on_every_rank(world_size, run)
    full = DEFINITIONS[op](torch.stack([_value_of(r, (world_size, 2, 3)) for r in range(world_size)]))
    for rank, output in enumerate(outputs):
        assert torch.equal(output, full[rank]), (op, rank)


@pytest.mark.parametrize("op", ["MIN", "PRODUCT"])
def test_reduce_scatter_of_a_list_and_the_functional_form(op: str) -> None:
    world_size = 2

    def run(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        pieces = list(_value_of(rank, (world_size * 4,)).chunk(world_size))
        listed = torch.empty(4, dtype=torch.float64)
        dist.reduce_scatter(listed, pieces, op=getattr(dist.ReduceOp, op))
        functional = funcol.reduce_scatter_tensor(_value_of(rank, (world_size * 4,)), op.lower(), 0, dist.group.WORLD)
        return listed, funcol.wait_tensor(functional)

    outputs = _on_every_rank(world_size, run)
    full = DEFINITIONS[op](torch.stack([_value_of(r, (world_size * 4,)) for r in range(world_size)]))
    for rank, (listed, functional) in enumerate(outputs):
        assert torch.equal(listed, full.chunk(world_size)[rank]), (op, rank)
        assert torch.equal(functional, full.chunk(world_size)[rank]), (op, rank)


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_gives_the_reduction_to_the_destination_only(op: str) -> None:
    world_size, destination = 3, 1

    def run(rank: int) -> torch.Tensor:
        tensor = _value_of(rank, (5,))
        dist.reduce(tensor, destination, op=getattr(dist.ReduceOp, op))
        return tensor

    outputs = _on_every_rank(world_size, run)
    full = DEFINITIONS[op](torch.stack([_value_of(r, (5,)) for r in range(world_size)]))
    for rank, output in enumerate(outputs):
        expected = full if rank == destination else _value_of(rank, (5,))
        assert torch.equal(output, expected), (op, rank)


def test_a_subgroup_reduce_scatters_over_its_own_ranks() -> None:
    """Ranks {0, 2} of four reduce-scatter with MAX: each keeps its group-local block."""
    world_size = 4

    def run(rank: int) -> torch.Tensor | None:
        groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        output = torch.empty(3, dtype=torch.float64)
        group = groups[rank % 2]
        dist.reduce_scatter_tensor(output, _value_of(rank, (6,)), op=dist.ReduceOp.MAX, group=group)
        return output

    outputs = _on_every_rank(world_size, run)
    for members in ([0, 2], [1, 3]):
        full = torch.stack([_value_of(r, (6,)) for r in members]).amax(0)
        for local, rank in enumerate(members):
            assert torch.equal(outputs[rank], full.chunk(2)[local]), rank


def test_the_threaded_group_is_left_as_it_was() -> None:
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    before = ProcessLocalGroup.reduce_scatter
    _on_every_rank(2, lambda rank: None)
    assert ProcessLocalGroup.reduce_scatter is before
    assert "reduce" not in ProcessLocalGroup.__dict__
