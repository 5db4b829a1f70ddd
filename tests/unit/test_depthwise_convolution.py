"""A depthwise convolution (one filter per channel) is captured as one operation of its own,
`shardproof::depthwise_convolution`, without the group count (the number of channels), so that a
rank convolving its block of the channels runs the reference's operation on fewer channels; the
rule `depthwise-convolution-of-channel-blocks` relates the two (checked on concrete tensors by the
rule checks). Any other convolution stays torch's. Its meaning in the rule checker is torch's
convolution with one group per channel."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from shardproof.capture.normalize import to_graph
from shardproof.rulecheck.meaning import _generic

KEY = "shardproof::depthwise_convolution#0"


def _graph(conv: nn.Module, shape: tuple[int, ...]):
    class Call(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = conv

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    program = torch.export.export(Call().to("meta"), (torch.randn(shape, device="meta"),), strict=False)
    return to_graph(program, "reference", None, 1, None)


@pytest.mark.parametrize(
    ("conv", "shape", "args"),
    [
        (nn.Conv1d(8, 8, kernel_size=4, groups=8, padding=3), (2, 8, 16), [[1], [3], [1]]),  # Mamba's
        (
            nn.Conv2d(4, 4, kernel_size=3, groups=4, padding=1, dilation=2, bias=False),
            (1, 4, 7, 7),
            [[1, 1], [1, 1], [2, 2]],
        ),
    ],
)
def test_a_depthwise_convolution_is_one_operation_without_its_group_count(conv, shape, args) -> None:
    graph = _graph(conv, shape)
    (call,) = [n for n in graph.nodes if n.op == "generic"]
    assert call.attrs["target"] == "shardproof::depthwise_convolution" and call.attrs["args"] == args
    assert len(call.inputs) == (3 if conv.bias is not None else 2)


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv1d(6, 6, 3),
        nn.Conv1d(6, 6, 3, groups=3),
        nn.Conv1d(6, 12, 3, groups=6),
        nn.ConvTranspose1d(6, 6, 3, groups=6),
    ],
)
def test_any_other_convolution_stays_torch_s(conv) -> None:
    graph = _graph(conv, (2, 6, 9))
    assert all(n.attrs.get("target") != "shardproof::depthwise_convolution" for n in graph.nodes)


def test_its_meaning_is_torch_s_convolution_with_one_group_per_channel() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 9, generator=generator, dtype=torch.float64)
    weight = torch.randn(5, 1, 3, generator=generator, dtype=torch.float64)
    bias = torch.randn(5, generator=generator, dtype=torch.float64)
    expected = torch.nn.functional.conv1d(x, weight, bias, 2, 1, 1, groups=5)
    assert torch.allclose(_generic(KEY, [x, weight, bias], json.dumps([[2], [1], [1]])), expected)
    # the law on concrete tensors: a block of the channels of input, filters and bias
    block = _generic(KEY, [x[:, 1:4], weight[1:4], bias[1:4]], json.dumps([[2], [1], [1]]))
    assert torch.allclose(block, expected[:, 1:4])
