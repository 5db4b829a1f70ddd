"""Which block instances the recorder lets one template stand for (capture/blocks.py)."""

from __future__ import annotations

import torch
from torch import nn

from shardproof.capture import blocks

OUTSIDE = torch.ones(8, device="meta")


class Block(nn.Module):
    def __init__(self, index: int, mode: str = "plain") -> None:
        super().__init__()
        self.index, self.mode = index, mode
        self.proj = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "branch" and self.index == 2:
            return x  # one layer skips its work
        if self.mode == "write-input":
            x.view(-1).add_(1.0)  # a write through a view of the input
        if self.mode == "outside":
            return self.proj(x) * OUTSIDE  # a tensor that is neither an input nor the block's
        return x + self.proj(x)


def record(mode: str) -> list[blocks.BlockInstance]:
    with torch.device("meta"):
        model = nn.Sequential(*(Block(i, mode) for i in range(4)))
    return blocks.record(model, (torch.zeros(2, 8, device="meta"),))


def test_identical_layers_share_the_first_as_their_template() -> None:
    instances = record("plain")
    assert [i.path for i in instances] == ["0", "1", "2", "3"]
    assert all(i.memoizable and i.template == "0" for i in instances)


def test_a_layer_whose_code_path_differs_gets_its_own_template() -> None:
    templates = {i.path: i.template for i in record("branch")}
    assert templates == {"0": "0", "1": "0", "2": "2", "3": "0"}


def test_a_write_into_a_view_of_the_input_is_not_memoized() -> None:
    assert not any(i.memoizable for i in record("write-input"))


def test_a_tensor_from_outside_the_block_is_not_memoized() -> None:
    assert not any(i.memoizable for i in record("outside"))
