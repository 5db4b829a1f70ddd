"""Indexing with a list of ints (capture/folding.py ListedIndices, lower_indexing._evenly_spaced):
the list is indexed as the tensor of its ints, whose value capture knows, and evenly spaced
positions read as the slice they are (Falcon's `fused[..., [-2], :]`)."""

from __future__ import annotations

import torch
from torch import nn

from shardproof.capture.exporting import export_module
from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph


def _graph(forward, shape: tuple[int, ...]) -> Graph:
    class Module(nn.Module):
        def forward(self, x):
            return forward(x)

    program = export_module(Module(), (torch.randn(shape, device="meta"),), "reference")
    return to_graph(program, "reference", None, 1, None)


def _ops(graph: Graph) -> list[tuple[str, dict]]:
    return [(n.op, {k: v for k, v in n.attrs.items() if k in ("dim", "start", "end")}) for n in graph.nodes]


def test_one_position_from_the_end_is_a_slice() -> None:
    graph = _graph(lambda x: x[..., [-2], :], (2, 3, 6, 4))
    assert _ops(graph) == [("slice", {"dim": -2, "start": 4, "end": 5})]


def test_evenly_spaced_positions_read_every_other_row() -> None:
    graph = _graph(lambda x: x[:, [1, 3, 5]], (2, 6))
    ops = [op for op, _ in _ops(graph)]
    assert "generic" not in ops and "slice" in ops


def test_positions_out_of_order_stay_an_index() -> None:
    graph = _graph(lambda x: x[:, [2, 0]], (2, 6))
    assert [n.attrs.get("target") for n in graph.nodes] == ["aten::index.Tensor"]


def test_the_list_index_computes_what_torch_computes() -> None:
    x = torch.randn(2, 3, 6, 4)
    assert torch.equal(x[..., [-2], :], x[..., torch.tensor([-2]), :])
    assert torch.equal(x[..., [-2], :], x[..., 4:5, :])
