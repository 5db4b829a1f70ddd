"""Values computed from constants alone (capture/folding.py): evaluated while capturing, so one
constant is one value however a program writes it, and the encoder says so."""

from __future__ import annotations

import torch
from term_values import unions_hold
from torch import nn

from shardproof.capture import folding
from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph
from shardproof.verify.encode import encode_unit


def _graph(forward, *shapes: tuple[int, ...]) -> Graph:
    class Module(nn.Module):
        def forward(self, *xs):
            return forward(*xs)

    inputs = tuple(torch.randn(shape, device="meta") for shape in shapes)
    program = torch.export.export(Module(), inputs, strict=False)
    return to_graph(program, "reference", None, 1, None)


def _causal(size: int, like: torch.Tensor) -> torch.Tensor:
    return torch.ones(size, size, dtype=torch.bool, device=like.device).triu(1)


def _mask_digests(graph: Graph) -> list[str | None]:
    """The folded digest of the mask each masked_fill reads."""
    nodes = graph.node_map()
    return [nodes[n.inputs[1]].attrs.get("folded") for n in graph.nodes if n.op == "fill"]


def test_a_causal_mask_written_three_ways_is_one_constant() -> None:
    def masked(x):
        s = x.shape[-1]
        first = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        second = torch.tril(torch.ones(s, s, device=x.device)) == 0
        third = torch.arange(s, device=x.device)[None, :] > torch.arange(s, device=x.device)[:, None]
        return x.masked_fill(first, 0.0) + x.masked_fill(second, 1.0) + x.masked_fill(third, 2.0)

    digests = _mask_digests(_graph(masked, (2, 6, 6)))
    expected = folding.value_digest(torch.ones(6, 6, dtype=torch.bool).triu(1))
    assert digests == [expected] * 3


def test_a_value_read_from_an_input_is_not_a_constant() -> None:
    graph = _graph(lambda x: x.masked_fill(x > 0, 0.0) * torch.ones(3, device=x.device), (2, 3))
    assert _mask_digests(graph) == [None]
    assert not any("folded" in n.attrs for n in graph.nodes if n.op in ("fill", "binary", "scalar"))


def test_a_large_constant_keeps_its_structure(monkeypatch) -> None:
    monkeypatch.setattr(folding, "MAX_ELEMENTS", 16)
    graph = _graph(lambda x: x.masked_fill(_causal(6, x), 0.0), (6, 6))
    assert _mask_digests(graph) == [None]


def test_the_digest_is_of_dtype_shape_and_contents() -> None:
    ones = torch.ones(2, 3)
    digests = {
        folding.value_digest(t) for t in (ones, ones.double(), ones.view(3, 2), ones.bool(), ones * 2, ones.clone())
    }
    assert len(digests) == 5  # the clone is the same constant


def test_the_encoder_states_a_folded_value_is_its_constant() -> None:
    graph = _graph(lambda x: x.masked_fill(_causal(4, x), 0.0), (4, 4))
    commands = encode_unit(graph, {}, []).commands
    digest = folding.value_digest(torch.ones(4, 4, dtype=torch.bool).triu(1))
    assert sum(f'(Const "{digest}")' in c and c.startswith("(union ") for c in commands) >= 1


def test_adding_a_mask_of_zeros_and_minus_infinity_is_filling_its_positions() -> None:
    def biased(x):
        bias = torch.triu(torch.full((4, 4), float("-inf"), device=x.device), diagonal=1)
        return x + bias

    graph = _graph(biased, (2, 4, 4))
    (add,) = [n for n in graph.nodes if n.op == "binary" and n.attrs["fn"] == "add"]
    bias = graph.node_map()[add.inputs[1]]
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    assert bias.attrs["neg_inf_at"] == folding.value_digest(future)
    commands = encode_unit(graph, {}, []).commands
    assert any("(Fill " in c and c.startswith("(union ") for c in commands)
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    constants = {
        folding.value_digest(future): future,
        bias.attrs["folded"]: torch.triu(torch.full((4, 4), float("-inf"), dtype=torch.float64), diagonal=1),
    }
    assert unions_hold(commands, {"0": x}, constants) >= 1


def test_a_mask_with_other_values_is_no_fill() -> None:
    graph = _graph(lambda x: x + torch.triu(torch.full((4, 4), -1e9, device=x.device), diagonal=1), (4, 4))
    assert not any("neg_inf_at" in n.attrs for n in graph.nodes)
