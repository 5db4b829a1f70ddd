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
    assert ([Piece(0, "z", -3, 2, 4, False), Piece(1, "z", -3, 2, 4, False)], -2, None) in readings


def test_a_concatenation_moved_by_one_permute_is_read_with_the_permutation() -> None:
    """The regrouped dispatch then `permute(1, 0, 2)`: the value is the concatenation permuted."""
    graphs = {r: _rank(r, 4, 2, True) for r in (0, 1)}
    for graph in graphs.values():
        graph.nodes.append(Node("moved", "permute", ("merged",), {"perm": [1, 0, 2]}, TensorMeta((4, 2, 3), "float32")))
    calls = {r: graphs[r].nodes[0] for r in (0, 1)}
    readings = fold(Exchange("all_to_all", (0, 1), calls, graphs), 1, graphs[1].nodes[1:])
    assert ([Piece(0, "z", -3, 2, 4, False), Piece(1, "z", -3, 2, 4, False)], -2, (1, 0, 2)) in readings


def test_without_the_transpose_the_groups_are_interleaved_and_read_as_what_they_are() -> None:
    """Not the groups in rank order: the received experts' blocks one after the other (along the
    experts), viewed as [experts / 2, 2 * groups, 3]."""
    blocks = [Piece(0, "z", -3, 2, 4, False), Piece(1, "z", -3, 2, 4, False)]
    assert _fold(regroup=False) == [(blocks, -3, None)]


def _list_exchange(rank: int, empty: bool = False) -> Graph:
    """`dist.all_to_all(received, list(x.chunk(2, dim=1)))` then `torch.cat(received, dim=0)`, as
    capture lowers it: each piece flattened into one buffer, the buffer exchanged, its halves
    viewed back and concatenated along another dim (DeepSpeed-Ulysses' sequence/head exchange).
    With `empty`, an empty slice of the buffer is taken as well (a split into a zero-size part)."""
    meta = TensorMeta((2, 4), "float32")
    piece, flat, half = TensorMeta((2, 2), "float32"), TensorMeta((4,), "float32"), TensorMeta((8,), "float32")
    nodes = [
        Node("p0", "slice", ("x",), {"dim": -1, "start": 0, "end": 2}, piece),
        Node("p1", "slice", ("x",), {"dim": -1, "start": 2, "end": 4}, piece),
        Node("f0", "view", ("p0",), {"shape": [4]}, flat),
        Node("f1", "view", ("p1",), {"shape": [4]}, flat),
        Node("buf", "cat", ("f0", "f1"), {"dim": -1}, half),
        Node("a2a", "all_to_all", ("buf",), {}, half, collective=Collective("all_to_all", None, (0, 1))),
        Node("r0", "slice", ("a2a",), {"dim": -1, "start": 0, "end": 4}, flat),
        Node("r1", "slice", ("a2a",), {"dim": -1, "start": 4, "end": 8}, flat),
        Node("v0", "view", ("r0",), {"shape": [2, 2]}, piece),
        Node("v1", "view", ("r1",), {"shape": [2, 2]}, piece),
        Node("out", "cat", ("v0", "v1"), {"dim": -2}, TensorMeta((4, 2), "float32")),
    ]
    if empty:
        nodes.append(Node("none", "slice", ("a2a",), {"dim": -1, "start": 8, "end": 8}, TensorMeta((0,), "float32")))
    return Graph(f"rank{rank}", rank, 2, [Placeholder("x", "input", "0", meta)], nodes, ["out"])


def test_an_exchange_of_a_list_of_pieces_is_followed_through_slices_and_concatenations() -> None:
    graphs = {r: _list_exchange(r) for r in (0, 1)}
    calls = {r: graphs[r].node_map()["a2a"] for r in (0, 1)}
    exchange = Exchange("all_to_all", (0, 1), calls, graphs)
    nodes = graphs[1].node_map()
    after = [nodes[n] for n in ("r0", "r1", "v0", "v1", "out")]
    # rank 1 receives the second column block of every rank's x, stacked along the rows in rank order
    assert ([Piece(0, "x", -1, 2, 4, False), Piece(1, "x", -1, 2, 4, False)], -2, None) in fold(exchange, 1, after)


def test_an_empty_slice_of_the_received_value_states_nothing() -> None:
    graphs = {r: _list_exchange(r, empty=True) for r in (0, 1)}
    calls = {r: graphs[r].node_map()["a2a"] for r in (0, 1)}
    assert fold(Exchange("all_to_all", (0, 1), calls, graphs), 0, [graphs[0].node_map()["none"]]) == []


def _back_to_sequence(rank: int, moved: list[int]) -> Graph:
    """DeepSpeed-Ulysses' exchange back from head blocks to sequence blocks, for 2 ranks: a rank's
    attention output t [batch 2, heads 2, seq 4, dim 3] split along the sequence and exchanged
    ([rank, seq / 2, batch, heads, dim]), the received blocks moved by `moved` and merged into the
    hidden dim by one view ([batch, seq / 2, 2 * heads * dim])."""
    meta = TensorMeta((2, 2, 4, 3), "float32")
    sent = TensorMeta((2, 2, 2, 2, 3), "float32")
    back = TensorMeta(tuple(sent.shape[d] for d in moved), "float32")
    nodes = [
        Node("split", "view", ("t",), {"shape": [2, 2, 2, 2, 3]}, TensorMeta((2, 2, 2, 2, 3), "float32")),
        Node("send", "permute", ("split",), {"perm": [2, 3, 0, 1, 4]}, sent),
        Node("a2a", "all_to_all", ("send",), {}, sent, collective=Collective("all_to_all", None, (0, 1))),
        Node("moved", "permute", ("a2a",), {"perm": moved}, back),
        Node("merged", "view", ("moved",), {"shape": [2, 2, 12]}, TensorMeta((2, 2, 12), "float32")),
    ]
    return Graph(f"rank{rank}", rank, 2, [Placeholder("t", "input", "0", meta)], nodes, ["merged"])


def _fold_back(moved: list[int]) -> list:
    graphs = {r: _back_to_sequence(r, moved) for r in (0, 1)}
    nodes = graphs[1].node_map()
    calls = {r: graphs[r].node_map()["a2a"] for r in (0, 1)}
    return fold(Exchange("all_to_all", (0, 1), calls, graphs), 1, [nodes["moved"], nodes["merged"]])


def test_the_exchange_back_to_sequence_blocks_is_a_view_of_the_head_blocks_permuted() -> None:
    """Rank 1 holds sequence block 1 of every rank's heads, the ranks' heads side by side: the
    concatenation of t_0[:, :, 2:4] and t_1[:, :, 2:4] along the heads, moved to [batch, seq, heads,
    dim] (the view to the hidden dim is the encoder's, from the value's shape)."""
    expected = ([Piece(0, "t", -2, 2, 4, False), Piece(1, "t", -2, 2, 4, False)], -3, (0, 2, 1, 3))
    assert expected in _fold_back([2, 1, 0, 3, 4])


def test_the_ranks_heads_interleaved_are_not_read_as_the_heads_side_by_side() -> None:
    """The received blocks moved behind the heads (`permute(2, 1, 3, 0, 4)`): each hidden row
    interleaves the ranks' heads. What that is (a concatenation along the head dim) is read, never
    the heads side by side."""
    readings = _fold_back([2, 1, 3, 0, 4])
    blocks = [Piece(0, "t", -2, 2, 4, False), Piece(1, "t", -2, 2, 4, False)]
    assert not [reading for reading in readings if reading[0] == blocks and reading[1] == -3]
    assert (blocks, -1, (0, 2, 1, 3)) in readings


def test_one_members_block_picked_from_the_received_value_is_that_members_block() -> None:
    """The dispatch's received blocks viewed as [ranks, experts / 2, groups, 3] and the block from
    rank 0 selected (`[0]`, captured as a slice and a view): what rank 0 sent, experts 2..3 of its z."""
    graphs = {r: _rank(r, 4, 2, True) for r in (0, 1)}
    for graph in graphs.values():
        del graph.nodes[1:]
        graph.nodes += [
            Node("split", "view", ("a2a",), {"shape": [2, 2, 2, 3]}, TensorMeta((2, 2, 2, 3), "float32")),
            Node("first", "slice", ("split",), {"dim": -4, "start": 0, "end": 1}, TensorMeta((1, 2, 2, 3), "float32")),
            Node("picked", "view", ("first",), {"shape": [2, 2, 3]}, TensorMeta((2, 2, 3), "float32")),
        ]
        graph.outputs = ["picked"]
    calls = {r: graphs[r].nodes[0] for r in (0, 1)}
    readings = fold(Exchange("all_to_all", (0, 1), calls, graphs), 1, graphs[1].nodes[1:])
    assert readings == [([Piece(0, "z", -3, 2, 4, False)], -3, None)]
