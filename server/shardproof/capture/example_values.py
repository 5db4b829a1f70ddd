"""What the example inputs' integer values span, for the lowerings whose function depends on it.

Capture runs on meta tensors, so lowering sees shapes only. A cross entropy's targets are taken
to be class indices in [0, C) (README, Limits), where the ignore index changes nothing; when the
example's own targets hold a value outside that range (the -100 that marks padding and prompt
tokens in Hugging Face labels), that assumption is visibly false for the user's inputs, and the
loss is lowered as torch computes it, the ignored tokens left out (lower_indexing.py). The ranges
are those of the example the check is being captured with: `remember` is called where the example
inputs are made (CheckCapture.example_inputs), before anything of the check is traced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

_RANGES: dict[int, tuple[int, int]] = {}  # user input index (flattened, as export numbers them) -> (min, max)

_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def remember(inputs: tuple[Any, ...]) -> None:
    """The value range of every integer tensor among `inputs`, by its flattened input index."""
    _RANGES.clear()
    for index, leaf in enumerate(tree_leaves(inputs)):
        if isinstance(leaf, torch.Tensor) and leaf.dtype in _INTEGERS and leaf.numel() and leaf.device.type != "meta":
            _RANGES[index] = (int(leaf.min()), int(leaf.max()))


def input_range(index: int) -> tuple[int, int] | None:
    """The (min, max) of user input `index` in the current check's example, if it is an integer
    tensor with values."""
    return _RANGES.get(index)
