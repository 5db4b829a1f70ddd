"""Instances of the law of a depthwise convolution on a block of its channels (verify/rules.py,
`depthwise-convolution-of-channel-blocks` and its bias-less twin)."""

from __future__ import annotations

import json
from typing import Any

from .generation import Gen
from .instances import instance, near_miss
from .meaning import range_list


def _depthwise(g: Gen, bias: bool) -> dict[str, Any]:
    """A depthwise convolution in one or two spatial dims (stride, padding and dilation drawn), a
    block of its channels."""
    spatial = g.int(1, 2)
    channels = g.int(3, 6)
    kernel = [g.int(1, 3) for _ in range(spatial)]
    stride = [g.int(1, 2) for _ in range(spatial)]
    padding = [g.int(0, 2) for _ in range(spatial)]
    dilation = [g.int(1, 2) for _ in range(spatial)]
    x = g.tensor(g.int(1, 2), channels, *[g.int(6, 9) for _ in range(spatial)])
    bindings = {
        "X": x,
        "W": g.tensor(channels, 1, *kernel),
        "a": json.dumps([stride, padding, dilation]),
        "R": g.selection(channels),
        "dx": 1 - x.dim(),
        "dw": -(2 + spatial),
    }
    return bindings | ({"B": g.tensor(channels)} if bias else {})


instance("depthwise-convolution-of-channel-blocks")(lambda g: _depthwise(g, True))
instance("depthwise-convolution-without-bias-of-channel-blocks")(lambda g: _depthwise(g, False))


def _depthwise_along_space(g: Gen, bias: bool) -> dict[str, Any]:
    """The near miss: a two-dim convolution's first row of the input taken where its channels
    belong (the filters' size-1 dim taken whole, one channel when there is a bias): a convolution
    mixes neighbouring rows, so the result is no block of the output."""
    channels = 1 if bias else g.int(2, 4)
    kernel = [g.int(2, 3), g.int(1, 3)]
    x = g.tensor(g.int(1, 2), channels, g.int(5, 7), g.int(5, 7))
    bindings = {
        "X": x,
        "W": g.tensor(channels, 1, *kernel),
        "a": json.dumps([[1, 1], [kernel[0] - 1, g.int(0, 1)], [1, 1]]),  # padded enough for one row
        "R": range_list([(0, 1)]),
        "dx": -2,
        "dw": -3,
    }
    return bindings | ({"B": g.tensor(channels)} if bias else {})


near_miss("depthwise-convolution-of-channel-blocks")(lambda g: _depthwise_along_space(g, True))
near_miss("depthwise-convolution-without-bias-of-channel-blocks")(lambda g: _depthwise_along_space(g, False))


def _dense(g: Gen, bias: bool) -> dict[str, Any]:
    """A dense convolution in one or two spatial dims (stride, padding and dilation drawn), a block
    of its filters."""
    spatial = g.int(1, 2)
    channels, filters = g.int(2, 4), g.int(3, 6)
    kernel = [g.int(1, 3) for _ in range(spatial)]
    x = g.tensor(g.int(1, 2), channels, *[g.int(7, 9) for _ in range(spatial)])
    bindings = {
        "X": x,
        "W": g.tensor(filters, channels, *kernel),
        "a": json.dumps([[g.int(1, 2)] * spatial, [g.int(0, 1) for _ in range(spatial)], [g.int(1, 2)] * spatial]),
        "R": g.selection(filters),
        "dx": 1 - x.dim(),
        "dw": -(2 + spatial),
    }
    return bindings | ({"B": g.tensor(filters)} if bias else {})


def _dense_flipped_kernel(g: Gen, bias: bool) -> dict[str, Any]:
    """The near miss: the filters' last kernel dim reversed (two filters, a kernel two wide), claimed
    as the two filters reversed: the output's channels are not."""
    spatial = g.int(1, 2)
    x = g.tensor(g.int(1, 2), g.int(2, 3), *[g.int(5, 7) for _ in range(spatial)])
    bindings = {
        "X": x,
        "W": g.tensor(2, x.shape[1], *[g.int(1, 2) for _ in range(spatial - 1)], 2),
        "a": json.dumps([[1] * spatial, [0] * spatial, [1] * spatial]),
        "R": range_list([(1, 2), (0, 1)]),
        "dx": 1 - x.dim(),
        "dw": -1,
    }
    return bindings | ({"B": g.tensor(2)} if bias else {})


instance("convolution-without-bias-of-output-channel-blocks")(lambda g: _dense(g, False))
near_miss("convolution-without-bias-of-output-channel-blocks")(lambda g: _dense_flipped_kernel(g, False))


def _input_channels(g: Gen) -> dict[str, Any]:
    """A dense convolution whose ranks hold a block of the input's channels and of the filters'."""
    spatial = g.int(1, 2)
    channels = g.int(4, 6)
    kernel = [g.int(1, 3) for _ in range(spatial)]
    x = g.tensor(g.int(1, 2), channels, *[g.int(6, 8) for _ in range(spatial)])
    s, e = g.tile(channels)
    return {
        "X": x,
        "W": g.tensor(g.int(2, 4), channels, *kernel),
        "a": json.dumps([[g.int(1, 2)] * spatial, [g.int(0, 1)] * spatial, [1] * spatial]),
        "s": s,
        "e": e,
        "K": channels,
        "dx": 1 - x.dim(),
        "dw": -(1 + spatial),
    }


def _input_positions(g: Gen) -> dict[str, Any]:
    """The near miss: blocks of the input's and the kernel's positions (as wide as each other),
    padded: the rank's products are shifted against the reference's, no contribution to it."""
    width = g.int(4, 5)
    x = g.tensor(g.int(1, 2), g.int(2, 3), width)
    s, e = g.tile(width)
    return {
        "X": x,
        "W": g.tensor(g.int(2, 3), x.shape[1], width),
        "a": json.dumps([[1], [1], [1]]),
        "s": s,
        "e": e,
        "K": width,
        "dx": -1,
        "dw": -1,
    }


instance("convolution-of-input-channel-blocks")(_input_channels)
near_miss("convolution-of-input-channel-blocks")(_input_positions)
