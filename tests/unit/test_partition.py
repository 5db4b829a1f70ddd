"""Cutting a world size at its blocks: what each part assumes about the values it reads from an
earlier part, and what the earlier part must prove in return (verify/partition.py)."""

from __future__ import annotations

import dataclasses

from shardproof.graph.model import Graph, Node, Placeholder, TensorMeta
from shardproof.relations import expr as px
from shardproof.verify.partition import SPLIT_ABOVE, block_of, partition, partition_block


def _graph(name: str, rank: int | None, steps: list[tuple[str, str, tuple[int, ...]]]) -> Graph:
    """A chain of nodes after one input: (id, module path, shape) each."""
    nodes, previous = [], "x"
    for node_id, module_path, shape in steps:
        nodes.append(Node(node_id, "neg", (previous,), {}, TensorMeta(shape, "float32"), module_path=module_path))
        previous = node_id
    x = Placeholder("x", "input", "0", TensorMeta((4, 8), "float32"))
    return Graph(name, rank, 2, [x], nodes, [previous])


def _model(residual_shape: tuple[int, ...], order: tuple[str, str] = ("layers.0", "layers.1")) -> list[tuple]:
    return [
        ("embed", "tok_embeddings", (4, 8)),
        ("attn0", f"{order[0]}.attention", residual_shape),
        ("mlp0", f"{order[0]}.feed_forward", residual_shape),
        ("attn1", f"{order[1]}.attention", residual_shape),
        ("out", "output", (4, 8)),
    ]


def test_blocks_are_named_by_the_first_numbered_component_of_the_module_path() -> None:
    def node(path: str) -> Node:
        return Node("n", "neg", (), {}, TensorMeta((1,), "float32"), module_path=path)

    assert block_of(node("layers.3.attention.wq")) == "layers.3"
    assert block_of(node("model.decoder.layers.12")) == "model.decoder.layers.12"
    assert block_of(node("h2.mlp")) is None
    assert block_of(node("output")) is None


def test_a_sequence_sharded_residual_is_assumed_to_be_each_ranks_block_and_proven_upstream() -> None:
    reference = _graph("reference", None, _model((4, 8)))
    ranks = [(_graph(f"rank{r}", r, _model((2, 8))), {}) for r in range(2)]
    parts = partition(reference, {}, ranks)
    assert parts is not None
    assert [p.label for p in parts] == ["(before the first block)", "layers.0", "layers.1"]
    assert [p.final for p in parts] == [False, False, True]
    # layer 1 reads mlp0: on rank r, rows [2r:2r+2] of the reference's
    layer1 = parts[2]
    (cut,) = [p for p in layer1.reference.placeholders if p.id == "mlp0"]
    assert cut.kind == "buffer" and layer1.reference_values[cut.target] == px.ParamRef(
        name=cut.target, shape=(4, 8), dtype="float32"
    )
    rank1_graph, rank1_values = layer1.ranks[1]
    assumed = rank1_values[cut.target]
    assert isinstance(assumed, px.SliceOf) and (assumed.dim, assumed.start, assumed.end) == (-2, 2, 4)
    assert [n.id for n in rank1_graph.nodes] == ["attn1", "out"] and rank1_graph.outputs == ["out"]
    # ... which layer 0 must prove
    (obligation,) = parts[1].obligations
    assert obligation.reference == "mlp0" and obligation.ranks == ("mlp0", "mlp0")
    assert obligation.expected == ((-2, 0, 2), (-2, 2, 4))
    # the embedding is read by layer 0 whole: equal on every rank
    assert parts[0].obligations[0].expected == (None, None)


def test_programs_whose_blocks_differ_are_not_cut() -> None:
    reference = _graph("reference", None, _model((4, 8)))
    swapped = [(_graph(f"rank{r}", r, _model((4, 8), ("layers.1", "layers.0"))), {}) for r in range(2)]
    assert partition(reference, {}, swapped) is None
    one_block = [(_graph(f"rank{r}", r, _model((4, 8), ("layers.0", "layers.0"))), {}) for r in range(2)]
    assert partition(_graph("reference", None, _model((4, 8), ("layers.0", "layers.0"))), {}, one_block) is None


def test_a_value_with_no_block_layout_of_the_reference_is_not_cut() -> None:
    reference = _graph("reference", None, _model((4, 8)))
    odd = [(_graph(f"rank{r}", r, _model((3, 8))), {}) for r in range(2)]  # 3 does not divide 4
    assert partition(reference, {}, odd) is None


def test_a_large_block_is_cut_again_at_its_sub_modules(monkeypatch) -> None:
    from shardproof.verify import partition as module

    monkeypatch.setattr(module, "SPLIT_ABOVE", 1)
    monkeypatch.setattr(module, "SMALLEST_PART", 1)
    reference = _graph("reference", None, _model((4, 8)))
    ranks = [(_graph(f"rank{r}", r, _model((4, 8))), {}) for r in range(2)]
    parts = partition(reference, {}, ranks)
    assert parts is not None
    # layer 0 runs in its attention and its MLP; layer 1 has one sub-module and stays whole
    assert [p.label for p in parts] == [
        "(before the first block)",
        "layers.0.attention",
        "layers.0.feed_forward",
        "layers.1",
    ]
    assert [o.reference for o in parts[1].obligations] == ["attn0"]  # the attention's output, read by the MLP


def _block(name: str, rank: int | None, shape: tuple[int, ...]) -> list[tuple]:
    """A memoized template's programs: every node inside the wrapper's `block` module."""
    attention = [(f"a{i}", "block.attention", shape) for i in range(SPLIT_ABOVE // 2 + 1)]
    mlp = [(f"m{i}", "block.feed_forward", shape) for i in range(SPLIT_ABOVE // 2 + 1)]
    return _graph(name, rank, [*attention, *mlp, ("add", "block", shape)])


def test_a_large_template_is_cut_at_its_sub_modules_and_its_outputs_stay_in_the_last_part() -> None:
    reference = _block("reference", None, (4, 8))
    ranks = [(_block(f"rank{r}", r, (2, 8)), {}) for r in range(2)]
    parts = partition_block(reference, {}, ranks)
    assert parts is not None
    assert [p.label for p in parts] == ["block.attention", "block.feed_forward"]
    assert parts[-1].final and parts[-1].reference.outputs == ["add"]
    # the MLP reads the attention's last value, assumed to be each rank's block and proven upstream
    (obligation,) = parts[0].obligations
    assert obligation.reference == f"a{SPLIT_ABOVE // 2}" and obligation.expected == ((-2, 0, 2), (-2, 2, 4))


def test_a_small_template_or_one_outside_a_single_module_is_not_cut() -> None:
    small = _graph("reference", None, [("a", "block.attention", (4, 8)), ("m", "block.feed_forward", (4, 8))])
    assert partition_block(small, {}, [(small, {})]) is None
    reference = _block("reference", None, (4, 8))
    reference.nodes[0] = dataclasses.replace(reference.nodes[0], module_path="elsewhere")
    assert partition_block(reference, {}, [(reference, {})]) is None
