"""A slice of a view is stated equal to the view of slices of the view's source, and a view of a view
to the view of its source (verify/twins.py): the identities are checked on concrete tensors (the
pieces `slice_of_view_pieces` names, over every slice of small views; the encoder's unions through
the rule checker's meaning of each term)."""

from __future__ import annotations

import itertools

import pytest
import torch
from term_values import traced, unions_hold

from shardproof.verify.encode import encode_unit
from shardproof.verify.twins import MOST_SLICE_PIECES, slice_of_view_pieces

_VIEWS = [
    ((2, 12), (2, 3, 4)),
    ((2, 12), (2, 1, 12)),
    ((2, 12), (6, 4)),
    ((24,), (2, 3, 4)),
    ((4, 6), (2, 2, 6)),
    ((4, 6), (4, 2, 3)),
    ((2, 8, 32), (2, 8, 2, 16)),
    ((3, 1, 8), (3, 2, 4)),
    ((2, 3, 4), (6, 4)),
    ((4, 6), (24,)),
    ((2, 2, 3, 4), (2, 6, 4)),
]


@pytest.mark.parametrize(("source", "viewed"), _VIEWS)
def test_every_slice_of_a_view_that_has_pieces_is_the_view_of_their_concatenation(source, viewed) -> None:
    x = torch.randn(source, dtype=torch.float64)
    found = 0
    for position, size in enumerate(viewed):
        dim = position - len(viewed)
        for start, end in itertools.combinations(range(size + 1), 2):
            pieces = slice_of_view_pieces(source, viewed, dim, start, end)
            expected = x.view(viewed).narrow(position, start, end - start)
            if pieces is None:
                continue
            found += 1
            source_dim, ranges = pieces
            joined = torch.cat([x.narrow(source_dim, s, e - s) for s, e in ranges], dim=source_dim)
            assert torch.equal(joined.view(expected.shape), expected), (dim, start, end)
    assert found, "some slice of every view here reads whole rows of its source"


@pytest.mark.parametrize(
    ("source", "viewed", "dim", "span", "expected"),
    [
        ((2, 12), (2, 3, 4), -3, (1, 2), (-2, [(1, 2)])),  # the view keeps the outer dim
        ((2, 8, 32), (2, 8, 2, 16), -1, (0, 8), (-1, [(0, 8), (16, 24)])),  # a part of every group
        ((2, 8, 32), (2, 8, 2, 16), -2, (1, 2), (-1, [(16, 32)])),  # one group of them
        ((2, 8, 8), (2, 8, 2, 1, 4), -3, (1, 2), (-1, [(4, 8)])),  # `unbind` of [2, 1, head_dim]
    ],
)
def test_the_pieces_of_slices_of_splits(source, viewed, dim, span, expected) -> None:
    assert slice_of_view_pieces(source, viewed, dim, *span) == expected


def test_a_slice_of_an_outer_dim_split_from_an_inner_one_has_no_pieces() -> None:
    # [2, 12] -> [6, 4]: rows 0:3 of the view mix both source rows' halves; no source dim holds them
    assert slice_of_view_pieces((2, 12), (6, 4), -2, 0, 3) is None
    # the whole dim and a size-1 dim are no slice to rewrite
    assert slice_of_view_pieces((2, 12), (2, 3, 4), -1, 0, 4) is None
    assert slice_of_view_pieces((2, 12), (2, 1, 12), -2, 0, 1) is None
    # more pieces than the bound: no twin
    wide = MOST_SLICE_PIECES + 1
    assert slice_of_view_pieces((wide * 4,), (wide, 4), -1, 0, 2) is None


def _grouped_split(mixed: torch.Tensor) -> torch.Tensor:
    """Megatron's fused QKV output: [batch, seq, groups, (heads per group + 2) * head_dim], split."""
    b, s, _ = mixed.shape
    q, k, v = mixed.view(b, s, 2, 16).split([8, 4, 4], dim=-1)
    return q.reshape(b, s, 4, 4) * torch.cat([k, v], dim=-1).reshape(b, s, 4, 4)


def test_the_encoder_states_the_twins_of_a_grouped_split_and_they_hold() -> None:
    graph = traced(_grouped_split, (2, 3, 32))
    commands = encode_unit(graph, {}, []).commands
    pieces = [c for c in commands if c.startswith("(let ") and "piece" in c.split()[1]]
    assert len(pieces) == 6, "three slices of the view, each two pieces of the source (one per group)"
    # every union is checked on concrete tensors, the twins among them
    assert unions_hold(commands, {"0": torch.randn(2, 3, 32, dtype=torch.float64)}) >= 4


def _unbound_thirds(fused: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's fused projection viewed [batch, seq, heads, 3, head_dim] and unbound."""
    b, s, _ = fused.shape
    q, k, v = fused.view(b, s, 2, 3, 4).unbind(3)
    return q * k + v


def test_a_slice_of_a_split_dim_is_stated_as_a_run_of_the_merged_view_and_it_holds() -> None:
    graph = traced(_unbound_thirds, (2, 3, 24))
    commands = encode_unit(graph, {}, []).commands
    runs = [c for c in commands if c.startswith("(let ") and "run" in c.split()[1]]
    assert len(runs) == 3, "each third is a run of the [batch, seq, heads, 12] view"
    assert any('"2,3,2,12"' in c for c in commands), "the merged view is stated"
    # every union is checked on concrete tensors, the new twins among them
    assert unions_hold(commands, {"0": torch.randn(2, 3, 24, dtype=torch.float64)}) >= 6


def test_a_slice_of_a_dim_no_source_dim_splits_states_no_run() -> None:
    graph = traced(lambda x: x.view(6, 4)[1:3] * 2, (2, 12))  # the rows cross the source's dims
    commands = encode_unit(graph, {}, []).commands
    assert not [c for c in commands if c.startswith("(let ") and "run" in c.split()[1]]


def test_a_view_of_a_view_is_stated_as_the_view_of_the_source() -> None:
    graph = traced(lambda x: (x.view(4, 3, 2) * 2).view(2, 2, 6).view(24), (6, 4))
    commands = encode_unit(graph, {}, []).commands
    twins = [c for c in commands if c.startswith("(union ") and "view" in c]
    assert twins, "the last view is stated as a view of the doubled value"
    assert unions_hold(commands, {"0": torch.randn(6, 4, dtype=torch.float64)}) >= 1


def test_an_operand_viewed_with_leading_unit_dims_is_stated_without_them() -> None:
    graph = traced(lambda x, b: x + b.view(1, -1, 1, 1), (2, 3, 4, 4), (3,))
    commands = encode_unit(graph, {}, []).commands
    assert any(c.startswith("(union ") and "(Bin " in c for c in commands), "the add with the bias viewed (3, 1, 1)"
    values = {"0": torch.randn(2, 3, 4, 4, dtype=torch.float64), "1": torch.randn(3, dtype=torch.float64)}
    assert unions_hold(commands, values) >= 1


@pytest.mark.parametrize("fn", ["amax", "sum"])
def test_a_reduction_of_a_view_along_a_dim_it_keeps_is_the_view_of_the_reduction(fn) -> None:
    graph = traced(lambda x: getattr(x.view(6, 4), fn)(dim=-1), (2, 3, 4))
    commands = encode_unit(graph, {}, []).commands
    assert any("reduced" in c.split()[1] for c in commands if c.startswith("(let ")), "the source's reduction"
    assert unions_hold(commands, {"0": torch.randn(2, 3, 4, dtype=torch.float64)}) >= 2


def test_operands_both_stripped_of_the_dims_the_result_keeps_are_not_stated() -> None:
    # (1, 3, 1) + (1, 3, 1): both without their leading dim would add to (3, 1), not the result's shape
    graph = traced(lambda a, b: a.view(1, 3, 1) + b.view(1, 3, 1), (3,), (3,))
    commands = encode_unit(graph, {}, []).commands
    assert not any(c.startswith("(union ") and "(Bin " in c for c in commands)
