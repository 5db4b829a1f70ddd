"""Functionalisation is skipped only when it could not change what the verifier reads."""

import torch
import torch.distributed as dist
from torch import nn

from shardproof.capture.exporting import export_module, mutation_free
from shardproof.capture.fake_pg import fake_rank


class Reduces(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1


class ReadsAViewAfterTheReduction(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        flat = y.view(-1)  # aliases y: the all-reduce below changes it too
        dist.all_reduce(y)
        return flat + 1


class MutatesInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)
        return y


def _program(module: nn.Module) -> torch.export.ExportedProgram:
    with fake_rank(0, 2), torch.no_grad():
        return torch.export.export(module, (torch.randn(2, 4, device="meta"),), strict=False)


def test_collective_write_back_alone_is_mutation_free() -> None:
    assert mutation_free(_program(Reduces()))


def test_aliased_write_back_and_in_place_ops_are_functionalised() -> None:
    assert not mutation_free(_program(ReadsAViewAfterTheReduction()))
    assert not mutation_free(_program(MutatesInPlace()))


def test_functionalised_graph_sees_the_reduction_through_the_view() -> None:
    with fake_rank(0, 2):
        program = export_module(ReadsAViewAfterTheReduction(), (torch.randn(2, 4, device="meta"),), "test")
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert not any(t.endswith("_.default") and "assert" not in t for t in targets)
    assert any("all_reduce" in t for t in targets)
