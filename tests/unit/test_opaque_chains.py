"""A chain of opaque calls (a memoized skeleton: one block call per layer) is encoded as one
call, so a skeleton costs the same at 2 and at 126 layers; two programs are proven equal through
a chain exactly when they make the same calls, in the same order, on equal inputs."""

from __future__ import annotations

from shardproof.graph.model import Graph, Node, Placeholder, TensorMeta
from shardproof.verify.encode import encode_unit
from shardproof.verify.engine import saturate
from shardproof.verify.opaque_calls import collapse_opaque_chains
from shardproof.verify.relations_found import RelationIndex
from shardproof.verify.verdict import output_relations

META = TensorMeta((4, 8), "float32")


def _call(node_id: str, reads: tuple[str, ...], path: str, target: str = "shardproof::block") -> Node:
    args = [["<tensor>"] * len(reads), f"layers.0|{path}"]
    return Node(node_id, "generic", reads, {"target": target, "args": args, "kwargs": [], "index": 0}, META)


def _skeleton(name: str, rank: int | None, paths: list[str], side: str = "rope") -> Graph:
    """x -> neg -> one block call per path (each also reading `side`) -> neg -> output."""
    nodes = [Node("h", "neg", ("x",), {}, META)]
    previous = "h"
    for i, path in enumerate(paths):
        nodes.append(_call(f"block_{i}", (previous, side), path))
        previous = f"block_{i}"
    nodes.append(Node("out", "neg", (previous,), {}, META))
    placeholders = [Placeholder("x", "input", "0", META), Placeholder("rope", "input", "1", META)]
    placeholders.append(Placeholder("other", "input", "2", META))
    return Graph(name, rank, 2, placeholders, nodes, ["out"])


def test_a_chain_of_block_calls_becomes_one_call_with_every_instance_in_its_key() -> None:
    graph = collapse_opaque_chains(_skeleton("reference", None, [f"layers.{i}" for i in range(5)]))
    assert [n.id for n in graph.nodes] == ["h", "block_4", "out"]
    chain = graph.nodes[1]
    assert chain.inputs == ("h", "rope") and chain.attrs["target"] == "chain of shardproof::block"
    assert [call[1] for call in chain.attrs["args"]["calls"]] == [f"layers.0|layers.{i}" for i in range(5)]


def test_a_value_read_elsewhere_or_returned_ends_a_chain() -> None:
    graph = _skeleton("reference", None, [f"layers.{i}" for i in range(4)])
    graph.nodes.append(Node("peek", "neg", ("block_1",), {}, META))  # block_1 is read twice
    graph.outputs = ["out", "block_2"]  # block_2 is returned
    collapsed = collapse_opaque_chains(graph)
    # block_0 -> block_1 is a chain; block_1 has two readers; block_2 is an output; block_3 alone
    assert [n.id for n in collapsed.nodes] == ["h", "block_1", "block_2", "block_3", "out", "peek"]
    assert collapsed.nodes[1].attrs["target"] == "chain of shardproof::block"
    assert collapsed.nodes[2].attrs["target"] == "shardproof::block"


def test_calls_with_other_side_inputs_or_another_target_are_not_one_chain() -> None:
    graph = _skeleton("reference", None, [f"layers.{i}" for i in range(4)])
    nodes = graph.nodes
    nodes[3] = _call("block_2", ("block_1", "other"), "layers.2")  # reads another side input
    nodes[4] = _call("block_3", ("block_2", "other"), "layers.3", target="other::op")
    collapsed = collapse_opaque_chains(graph)
    assert [n.id for n in collapsed.nodes] == ["h", "block_1", "block_2", "block_3", "out"]
    assert [n.attrs["target"] for n in collapsed.nodes[1:4]] == [
        "chain of shardproof::block",
        "shardproof::block",
        "other::op",
    ]


def _replicated(reference: Graph, ranks: list[Graph]) -> bool:
    unit = encode_unit(reference, {}, [(graph, {}) for graph in ranks], outputs_only=True)
    saturation = saturate(unit.commands, 50, 30.0, 1_000_000)
    assert saturation.facts is not None
    index = RelationIndex(reference, ranks, saturation.facts)
    _, failing = output_relations(index, reference, ranks, "replicated")
    return not failing


def test_programs_making_the_same_calls_in_the_same_order_are_proven_equal() -> None:
    paths = [f"layers.{i}" for i in range(6)]
    reference = _skeleton("reference", None, paths)
    assert _replicated(reference, [_skeleton(f"rank{r}", r, paths) for r in range(2)])


def test_a_skipped_a_repeated_or_a_swapped_layer_is_not_proven() -> None:
    paths = [f"layers.{i}" for i in range(6)]
    reference = _skeleton("reference", None, paths)
    for wrong in (paths[:3] + paths[4:], paths[:4] + paths[3:], [*paths[:2], paths[3], paths[2], *paths[4:]]):
        ranks = [_skeleton("rank0", 0, paths), _skeleton("rank1", 1, wrong)]
        assert not _replicated(reference, ranks), wrong


def test_a_chain_on_another_side_input_is_not_proven() -> None:
    paths = [f"layers.{i}" for i in range(3)]
    reference = _skeleton("reference", None, paths)
    ranks = [_skeleton("rank0", 0, paths), _skeleton("rank1", 1, paths, side="other")]
    assert not _replicated(reference, ranks)


def test_opaque_calls_differing_only_in_keyword_names_are_different_terms() -> None:
    def program(name: str, rank: int | None, keyword: str) -> Graph:
        attrs = {"target": "mylib::op", "args": ["<tensor>", 1], "kwargs": [keyword], "index": 0}
        node = Node("y", "generic", ("x",), attrs, META)
        return Graph(name, rank, 1, [Placeholder("x", "input", "0", META)], [node], ["y"])

    assert _replicated(program("reference", None, "alpha"), [program("rank0", 0, "alpha")])
    assert not _replicated(program("reference", None, "alpha"), [program("rank0", 0, "beta")])
