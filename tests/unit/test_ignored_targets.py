"""A cross entropy's targets are taken to be class indices unless the example's targets show the
ignore index: then the loss is lowered as torch computes it, the ignored tokens left out of the
loss and of the mean's count (capture/lower_indexing.py, capture/example_values.py). The verdicts
this gives on real programs are in the corpora (`megatron-cross-entropy-loss-mask`, verified;
`loss-mean-over-ignored-tokens`, a discrepancy at the mean)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardproof.capture import example_values
from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph


@pytest.fixture(autouse=True)
def _forget_the_example():
    """The ranges are the current check's: none left behind for other tests' lowerings."""
    yield
    example_values.remember(())


class _Loss(nn.Module):
    def __init__(self, reduction: str) -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.view(-1, 8), targets[:, 1:].reshape(-1), reduction=self.reduction)


def _lowered(targets: torch.Tensor, reduction: str = "mean") -> Graph:
    logits = torch.randn(2 * 3, 8)
    example_values.remember((logits, targets))
    meta = (logits.to("meta"), targets.to("meta"))
    return to_graph(torch.export.export(_Loss(reduction), meta, strict=False), "reference", None, 1, None)


def _ops(graph: Graph) -> list[tuple[str, object, object]]:
    return [(n.op, n.attrs.get("fn"), n.attrs.get("value")) for n in graph.nodes]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_targets_holding_the_ignore_index_are_left_out_of_the_loss(reduction) -> None:
    targets = torch.randint(0, 8, (2, 4))
    targets[0, 1] = -100  # a shifted label the loss ignores (the slice keeps it)
    graph = _lowered(targets, reduction)
    ops = _ops(graph)
    assert ("scalar", "eq", -100) in ops, "the ignored targets' mask"
    assert ("fill", None, 0.0) in ops, "their losses zeroed"
    if reduction == "mean":
        assert ("unary", "logical_not", None) in ops, "the mean counts the other tokens"
        assert graph.nodes[-1].op == "binary" and graph.nodes[-1].attrs["fn"] == "div"


def test_class_indices_throughout_keep_the_plain_loss() -> None:
    targets = torch.randint(0, 8, (2, 4))
    ops = _ops(_lowered(targets))
    assert not any(fn == "eq" for _, fn, _ in ops)
    assert ("fill", None, 0.0) not in ops
