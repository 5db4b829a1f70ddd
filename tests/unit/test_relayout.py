"""An all-to-all with the views and permutes around it, evaluated on index tensors
(verify/relayout.py): the expert-parallel dispatch's regrouping is a concatenation of blocks."""

from __future__ import annotations

from shardproof.graph.model import Collective, Graph, Node, Placeholder, TensorMeta
from shardproof.verify.relayout import Exchange, Piece, fold


def _rank(rank: int, experts: int, groups: int, regroup: bool) -> Graph:
    """Source [experts, groups, 3]; all-to-all of expert blocks; on receipt, views and a transpose
    that put the received groups next to each other (or not, with `regroup` False)."""
    meta = TensorMeta((experts, groups, 3), "float32")
    half = experts // 2
    nodes = [
        Node(
            "a2a",
            "all_to_all",
            ("z",),
            {},
            meta,
            collective=Collective("all_to_all", None, (0, 1), input_splits=(half, half), output_splits=(half, half)),
        ),
        Node("split", "view", ("a2a",), {"shape": [2, half, groups, 3]}, TensorMeta((2, half, groups, 3), "float32")),
    ]
    if regroup:
        nodes.append(
            Node("swap", "permute", ("split",), {"perm": [1, 0, 2, 3]}, TensorMeta((half, 2, groups, 3), "float32"))
        )
    nodes.append(
        Node(
            "merged",
            "view",
            (nodes[-1].id,),
            {"shape": [half, 2 * groups, 3]},
            TensorMeta((half, 2 * groups, 3), "float32"),
        )
    )
    return Graph(f"rank{rank}", rank, 2, [Placeholder("z", "input", "0", meta)], nodes, ["merged"])


def _fold(regroup: bool) -> list[tuple[list[Piece], int]]:
    graphs = {r: _rank(r, 4, 2, regroup) for r in (0, 1)}
    calls = {r: graphs[r].nodes[0] for r in (0, 1)}
    after = graphs[1].nodes[1:]
    return fold(Exchange("all_to_all", (0, 1), calls, graphs), 1, after)


def test_the_regrouped_dispatch_is_every_ranks_block_of_my_experts_in_rank_order() -> None:
    readings = _fold(regroup=True)
    # rank 1 holds experts 2..3 of every rank's groups: z_0[2:4] then z_1[2:4], along the groups
    assert ([Piece(0, "z", -3, 2, 4, False), Piece(1, "z", -3, 2, 4, False)], -2) in readings


def test_without_the_transpose_the_groups_are_interleaved_and_nothing_is_stated() -> None:
    assert _fold(regroup=False) == []
