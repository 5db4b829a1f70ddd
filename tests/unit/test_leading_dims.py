"""A value flattened over its leading dims is computed on the unflattened value too
(capture/leading_dims.py): the operations that work position by position along the merged dim
get a twin on the unflattened value, and the node becomes its view. Checked on concrete tensors:
every term the encoder states is evaluated with the rule checks' meaning and the program's output
compared with torch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from term_values import traced, values_of

from shardproof.graph.model import Graph
from shardproof.verify.encode import encode_unit


def _twins_hold(graph: Graph, inputs: list[torch.Tensor]) -> int:
    """Evaluate every term the encoder states on concrete inputs, asserting every union (the
    twins' among them); the number of view twins whose union was checked."""
    unit = encode_unit(graph, {}, [])
    values = values_of(unit.commands, {str(i): x for i, x in enumerate(inputs)})
    checked = 0
    for value, twin in graph.view_twins.items():
        own, other = values.get(unit.term_of[(graph.name, value)]), values.get(unit.term_of[(graph.name, twin)])
        if own is not None and other is not None:
            assert torch.allclose(own, other.reshape(own.shape), rtol=1e-12, atol=1e-12), (value, twin)
            checked += 1
    return checked


def _loss_of_flattened_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A vocabulary-parallel loss's steps, written on logits flattened to [tokens, vocab]."""
    flat, ids = logits.flatten(0, 1), targets.long().flatten()
    shifted = flat - flat.max(dim=-1)[0].unsqueeze(-1)
    picked = shifted.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (shifted.exp().sum(-1).log() - picked).sum()


_PROGRAMS = [
    ("loss", _loss_of_flattened_logits, [(2, 3, 5), (2, 3)]),
    ("router", lambda x, w: F.softmax(F.linear(x.view(-1, 4), w), dim=-1).topk(2, dim=-1)[0], [(2, 3, 4), (6, 4)]),
    ("mean", lambda x: (x.reshape(-1, 4) * 2.0).mean(), [(2, 3, 4)]),
    ("permuted", lambda x: x.reshape(6, 2, 2).transpose(1, 2).exp(), [(2, 3, 2, 2)]),
    ("viewed back", lambda x: (x.view(-1, 4).relu() + 1.0).view(2, 3, 4), [(2, 3, 4)]),
    ("broadcast", lambda x, y: x.view(-1, 4) - y.view(-1, 1), [(2, 3, 4), (2, 3)]),
    ("whole sequences", lambda x: (x.reshape(-1, 4)[3:6] * 2.0).exp(), [(2, 3, 4)]),
    ("part of a sequence", lambda x: x.reshape(-1, 4)[4:6].relu(), [(2, 3, 4)]),
    # GPT-2's Conv1D: the bias added to the rows' product with a [in, out] weight, viewed back
    ("conv1d rows", lambda x, w, b: torch.addmm(b, x.view(-1, 4), w).view(2, 3, 5), [(2, 3, 4), (4, 5), (5,)]),
]


@pytest.mark.parametrize(("name", "program", "shapes"), _PROGRAMS, ids=[p[0] for p in _PROGRAMS])
def test_every_twin_holds_the_elements_of_its_value(name, program, shapes) -> None:
    graph = traced(program, *shapes)
    assert graph.view_twins, "twins on the unflattened values"
    inputs = [torch.randn(shape, dtype=torch.float64) for shape in shapes]
    if name == "loss":
        inputs[1] = torch.randint(0, 5, shapes[1]).double()  # class indices
    assert _twins_hold(graph, inputs) == len(graph.view_twins)


def test_the_flattened_loss_steps_have_twins_over_the_tokens_own_dims() -> None:
    graph = traced(_loss_of_flattened_logits, (2, 3, 5), (2, 3))
    nodes = graph.node_map()
    twins = {value: nodes[twin] for value, twin in graph.view_twins.items()}
    assert {(t.op, t.meta.shape) for t in twins.values()} >= {("reduce", (2, 3)), ("pick", (2, 3)), ("reduce", ())}
    # the total over the tokens: the lead dims reduced one at a time, as a sum over [2, 3] is written
    (total,) = [t for t in twins.values() if t.meta.shape == ()]
    assert nodes[total.inputs[0]].meta.shape == (3,)


def test_a_twin_is_read_only_by_twins() -> None:
    graph = traced(_loss_of_flattened_logits, (2, 3, 5), (2, 3))
    added = {n.id for n in graph.nodes if ".unflat" in n.id}
    assert added and all(set(n.inputs) & added == set() for n in graph.nodes if n.id not in added)
    assert not set(graph.outputs) & added


def test_a_product_with_a_flattened_matrix_is_left_as_written() -> None:
    # the matrix is itself a value flattened over its lead dims: only a plain matrix is twinned
    graph = traced(lambda x, z: x.view(-1, 4) @ z.view(-1, 5), (2, 3, 4), (2, 2, 5))
    assert not [n for n in graph.nodes if n.op == "matmul" and n.id.endswith(".unflat")]
    # a matrix computed from the rows is still one matrix for every row: twinned, and it holds
    graph = traced(lambda x: x.view(-1, 4) @ x.view(-1, 4).t(), (2, 3, 4))
    assert [n for n in graph.nodes if n.op == "matmul" and n.id.endswith(".unflat")]
    assert _twins_hold(graph, [torch.randn(2, 3, 4, dtype=torch.float64)]) == len(graph.view_twins)


def test_an_operation_across_the_merged_dim_has_no_twin() -> None:
    # a matrix product over the tokens (each output mixes every token) is not position-wise
    graph = traced(lambda x, w: w @ x.view(-1, 4), (2, 3, 4), (5, 6))
    assert not graph.view_twins


def test_flattenings_of_different_lead_dims_are_not_combined() -> None:
    graph = traced(lambda x, y: x.view(-1, 4) + y.view(-1, 4), (2, 3, 4), (3, 2, 4))
    assert not graph.view_twins


def test_an_index_taken_along_the_last_dim_is_no_flattening() -> None:
    graph = traced(lambda x: (x[..., 0] > 0).float() * 2.0, (3, 4))
    assert not graph.view_twins


def test_a_slice_of_tokens_across_sequences_has_no_twin() -> None:
    # rows 2..4 of [2 x 3] tokens: the end of one sequence and the start of the next, no box
    graph = traced(lambda x: x.reshape(-1, 4)[2:4] * 2.0, (2, 3, 4))
    assert not graph.view_twins
