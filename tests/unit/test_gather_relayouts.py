"""An all-gather cut back into its ranks' pieces and concatenated along another dim (the LM
head's `torch.cat(gathered.chunk(world_size), dim=-1)`): every rank's copy of the gathered value
is one term, so the encoder states each piece's relayout once, not once per rank
(verify/collective_encoding.py)."""

from __future__ import annotations

import pytest

from shardproof.graph.model import Collective, Graph, Node, Placeholder, TensorMeta
from shardproof.verify.encode import encode_unit

ROWS, COLS = 2, 3


def _rank(rank: int, world: int) -> Graph:
    group = tuple(range(world))
    nodes = [
        Node(
            "gathered",
            "all_gather",
            ("z",),
            {},
            TensorMeta((world * ROWS, COLS), "float32"),
            collective=Collective("all_gather", None, group, dim=0),
        )
    ]
    for i in range(world):
        attrs = {"dim": -2, "start": i * ROWS, "end": (i + 1) * ROWS}
        nodes.append(Node(f"chunk_{i}", "slice", ("gathered",), attrs, TensorMeta((ROWS, COLS), "float32")))
    pieces = tuple(f"chunk_{i}" for i in range(world))
    nodes.append(Node("joined", "cat", pieces, {"dim": -1}, TensorMeta((ROWS, world * COLS), "float32")))
    # the rank's own value (a parameter of unknown value: a leaf of its own on every rank)
    placeholder = Placeholder("z", "parameter", "w", TensorMeta((ROWS, COLS), "float32"))
    return Graph(f"rank{rank}", rank, world, [placeholder], nodes, ["joined"])


def _reference(world: int) -> Graph:
    placeholder = Placeholder("x", "input", "0", TensorMeta((ROWS, world * COLS), "float32"))
    return Graph("reference", None, 1, [placeholder], [], ["x"])


def _relayouts(world: int) -> list[str]:
    ranks = [(_rank(r, world), {}) for r in range(world)]
    commands = encode_unit(_reference(world), {}, ranks).commands
    # a relayout names a rank's piece of the gathered value and the rank's own value it is
    return [c.split() for c in commands if c.startswith("(union ") and "__chunk_" in c]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_each_piece_of_a_gathered_value_is_stated_once_for_all_ranks(world) -> None:
    stated = _relayouts(world)
    # piece i of the gathered value is rank i's own value: one fact per piece (not world x world)
    assert len(stated) == world, stated
    assert sorted(piece.split("__")[1] for _, piece, _ in stated) == sorted(f"chunk_{i}" for i in range(world))
    assert len({own for _, _, own in stated}) == world, "each piece is another rank's value"
