"""The reference built once for every rank, only when its builder reads nothing of the
distributed world (capture/program.py, `build_reference_for_ranks`)."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from shardproof.capture.program import build_reference_for_ranks


def test_a_builder_that_reads_nothing_of_the_world_is_built_once() -> None:
    built = build_reference_for_ranks(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    assert built is not None
    assert set(built.values) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert all(p.device.type == "meta" for p in built.module.parameters())


def test_a_builder_asking_whether_a_process_group_exists_builds_per_rank() -> None:
    def build() -> nn.Module:
        width = 8 if dist.is_initialized() else 4  # differs between the ranks' world and none
        return nn.Linear(width, width)

    assert build_reference_for_ranks(build) is None
    assert dist.is_initialized.__name__ == "is_initialized"  # put back


def test_a_builder_reading_its_rank_builds_per_rank() -> None:
    def build() -> nn.Module:
        return nn.Linear(4 + dist.get_rank(), 4)  # no process group here: raises

    assert build_reference_for_ranks(build) is None
