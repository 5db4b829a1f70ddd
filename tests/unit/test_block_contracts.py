"""A template proven under assumed input relations relates a rank's block calls to the
reference's exactly where the skeleton proves the call's inputs relate as assumed."""

from __future__ import annotations

import pytest

from shardproof.graph.model import Graph, Node, Placeholder, TensorMeta
from shardproof.relations.assumed import Unrelated, assumed_shard
from shardproof.verify import block_contracts
from shardproof.verify.block_contracts import Contract
from shardproof.verify.encode import encode_unit
from shardproof.verify.engine import saturate
from shardproof.verify.relations_found import RelationIndex

WHOLE = TensorMeta((8, 4), "float32")
BLOCK = TensorMeta((4, 4), "float32")


def _call(node_id: str, reads: str, path: str, meta: TensorMeta, template: str = "layers.0") -> Node:
    args = [["<tensor>"], f"{template}|{path}"]
    return Node(
        node_id, "generic", (reads,), {"target": "shardproof::block", "args": args, "kwargs": [], "index": 0}, meta
    )


def _skeleton(rank: int | None, starts: list[int], template_of_last: str = "layers.0") -> Graph:
    """The input, then (on a rank) its block at each layer's start, one block call per layer."""
    meta = WHOLE if rank is None else BLOCK
    nodes: list[Node] = []
    previous = "x"
    for i, start in enumerate(starts):
        if rank is not None and start is not None:
            # the rank re-takes its block of the whole input before each layer (the layers are
            # position-wise, so any block is a valid input: only the contract tells them apart)
            nodes.append(Node(f"take_{i}", "slice", ("x",), {"dim": -2, "start": start, "end": start + 4}, BLOCK))
            reads = f"take_{i}" if i == 0 else previous
        else:
            reads = previous
        template = template_of_last if i == len(starts) - 1 else "layers.0"
        nodes.append(_call(f"block_{i}", reads, f"layers.{i}", meta, template))
        previous = f"block_{i}"
    name = "reference" if rank is None else f"rank{rank}"
    return Graph(name, rank, 2, [Placeholder("x", "input", "0", WHOLE)], nodes, [previous])


def _contract(rank: int, template: str = "layers.0") -> Contract:
    block = (-2, 4 * rank, 4 * rank + 4)
    return Contract(template, rank, (block,), (block,))


def _proven_blocks(ranks: list[Graph], contracts: list[Contract], laws: bool = True) -> list[bool]:
    """Per rank: is its output proven its block of the reference's output?"""
    reference = _skeleton(None, [0, 0, 0])
    by_rank = {c.rank: {c.template: c} for c in contracts}
    own = [block_contracts.with_own_calls(g, by_rank[g.rank]) for g in ranks]
    rules = tuple(rule for c in contracts for rule in block_contracts.rules(c)) if laws else ()
    unit = encode_unit(reference, {}, [(g, {}) for g in own], outputs_only=True, call_laws=rules)
    saturation = saturate(unit.commands, 50, 30.0, 1_000_000)
    assert saturation.facts is not None
    index = RelationIndex(reference, own, saturation.facts)
    return [
        block_contracts.holds(index, reference.outputs[0], g.rank, g.outputs[0], _contract(g.rank).outputs[0])
        for g in own
    ]


def test_each_rank_output_is_its_block_when_every_call_receives_its_block() -> None:
    ranks = [_skeleton(0, [0, None, None]), _skeleton(1, [4, None, None])]
    assert _proven_blocks(ranks, [_contract(0), _contract(1)]) == [True, True]


def test_without_the_contract_rules_nothing_relates_the_calls() -> None:
    ranks = [_skeleton(0, [0, None, None]), _skeleton(1, [4, None, None])]
    assert _proven_blocks(ranks, [_contract(0), _contract(1)], laws=False) == [False, False]


def test_a_call_fed_another_block_than_the_contract_assumes_is_not_related() -> None:
    # rank 0 feeds its first layer the second block of the input (the same shape as its own)
    ranks = [_skeleton(0, [4, None, None]), _skeleton(1, [4, None, None])]
    assert _proven_blocks(ranks, [_contract(0), _contract(1)]) == [False, True]


def test_a_contract_stands_only_for_calls_of_its_own_template() -> None:
    # the last call is another template's: layers.0's contract says nothing of it
    ranks = [_skeleton(0, [0, None, None], "layers.2"), _skeleton(1, [4, None, None], "layers.2")]
    assert _proven_blocks(ranks, [_contract(0), _contract(1)]) == [False, False]


def test_the_assumed_relation_is_the_rank_block_of_the_one_differing_dim() -> None:
    assert assumed_shard(WHOLE, WHOLE, 1) is None
    assert assumed_shard(WHOLE, BLOCK, 1) == (-2, 4, 8)
    assert assumed_shard(TensorMeta((2, 8, 4), "float32"), TensorMeta((2, 2, 4), "float32"), 5) == (-2, 2, 4)
    with pytest.raises(Unrelated):
        assumed_shard(WHOLE, TensorMeta((4, 2), "float32"), 0)  # two dims differ
    with pytest.raises(Unrelated):
        assumed_shard(WHOLE, TensorMeta((3, 4), "float32"), 0)  # 3 does not divide 8
    with pytest.raises(Unrelated):
        assumed_shard(WHOLE, TensorMeta((8, 4), "bfloat16"), 0)


def test_a_congruent_contract_needs_no_rule_and_keeps_the_reference_operation() -> None:
    contract = Contract("layers.0", 0, (None,), (None,))
    assert contract.congruent and block_contracts.rules(contract) == []
    graph = _skeleton(0, [0, None])
    assert block_contracts.with_own_calls(graph, {"layers.0": contract}) is graph
