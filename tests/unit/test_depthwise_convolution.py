"""A depthwise convolution written out as what it computes (capture/decompose.py
`_depthwise_convolution`): the same function as torch's convolution, captured as a padding, one
window per kernel position times that position's weights and a sum, which the rules follow on a
block of channels. Every other convolution stays one operation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardproof.capture.decompose import _depthwise_convolution
from shardproof.capture.normalize import to_graph


@pytest.mark.parametrize(
    ("shape", "kernel", "padding", "dilation", "bias"),
    [
        ((2, 6, 9), (4,), [3], [1], True),  # Mamba's causal conv1d (the extra length cut off after)
        ((2, 6, 9), (3,), [0], [2], False),
        ((1, 4, 7, 5), (3, 3), [1, 1], [1, 1], True),  # ConvNeXt-style 2-D
        ((1, 4, 7, 5), (2, 3), [0, 2], [2, 1], False),
    ],
)
def test_the_written_out_convolution_is_torch_s(shape, kernel, padding, dilation, bias) -> None:
    generator = torch.Generator().manual_seed(0)
    channels = shape[1]
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    weight = torch.randn((channels, 1, *kernel), generator=generator, dtype=torch.float64)
    b = torch.randn(channels, generator=generator, dtype=torch.float64) if bias else None
    ones, zeros = [1] * len(kernel), [0] * len(kernel)
    expected = torch.ops.aten.convolution(x, weight, b, ones, padding, dilation, False, zeros, channels)
    found = _depthwise_convolution(x, weight, b, ones, padding, dilation, False, zeros, channels)
    assert torch.allclose(found, expected)


@pytest.mark.parametrize(
    ("groups", "out_channels", "stride"),
    [(1, 6, 1), (3, 6, 1), (6, 12, 1), (6, 6, 2)],  # dense, grouped, a channel multiplier, strided
)
def test_any_other_convolution_is_not_written_out(groups, out_channels, stride) -> None:
    x = torch.randn(2, 6, 9)
    weight = torch.randn(out_channels, 6 // groups, 3)
    with pytest.raises(NotImplementedError):
        _depthwise_convolution(x, weight, None, [stride], [1], [1], False, [0], groups)


def test_a_depthwise_conv1d_is_captured_as_windows_times_weights() -> None:
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(8, 8, kernel_size=4, groups=8, padding=3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    with torch.device("meta"):
        module = Conv()
    program = torch.export.export(module, (torch.randn(2, 8, 16, device="meta"),), strict=False)
    graph = to_graph(program, "reference", None, 1, None)
    ops = [n.op for n in graph.nodes]
    assert "generic" not in ops
    assert [n.attrs["fn"] for n in graph.nodes if n.op == "binary"].count("mul") == 4
    assert graph.meta_of(graph.outputs[0]).shape == (2, 8, 19)  # 16 + 2 * 3 - (4 - 1)
