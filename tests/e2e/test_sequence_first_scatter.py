"""Megatron-style sequence parallelism on batch-first activations is verified: the row-parallel
partial sums put sequence-first (`transpose(0, 1)` or `permute(1, 0, 2)`), reduce-scattered along
dim 0, the bias added to the rank's block, the blocks all-gathered and permuted back. Each step is
a law of the e-graph (a permuted partial sum is a partial sum of the permuted value; an
elementwise op with an operand the permutation keeps in place commutes with it; a permutation
undone is the value). Permuting back along the wrong dims, reading the gathered buffer with a view,
not permuting back, scattering partial sums that were never put sequence-first, or adding the
bias before the reduce-scatter is a discrepancy, shown by the numbers. The input is square in
batch and sequence (and hidden), so every wrong variant still has the reference's shape."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"

PROGRAM = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tinymlp.parallel import ParallelMLP


class SequenceFirst(ParallelMLP):
    def __init__(self, ref, rank, world_size, variant):
        super().__init__(ref, rank, world_size)
        self.variant = variant

    def forward(self, x):
        partial = F.linear(self.hidden(x), self.down_w)
        world_size = dist.get_world_size()
        if self.variant == "bias_before_scatter":
            partial = partial + self.down_b
        if self.variant == "permuted":
            partial = partial.permute(1, 0, 2).contiguous()
        elif self.variant != "scatter_untransposed":
            partial = partial.transpose(0, 1).contiguous()
        local = torch.empty((partial.shape[0] // world_size, *partial.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(local, partial)
        biased = local if self.variant == "bias_before_scatter" else local + self.down_b
        full = torch.empty((world_size * local.shape[0], *local.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(full, biased.contiguous())
        if self.variant == "permuted":
            return full.permute(1, 0, 2)
        if self.variant == "wrong_dims_back":
            return full.transpose(0, 2)
        if self.variant == "viewed_back":
            return full.view(x.shape)
        if self.variant == "not_transposed_back":
            return full
        return full.transpose(0, 1)


def build(variant):
    return lambda ref, rank, world_size: SequenceFirst(ref, rank, world_size, variant)


def square_inputs():
    return (torch.randn(16, 16, 16),)


transposed = build("transposed")
permuted = build("permuted")
wrong_dims_back = build("wrong_dims_back")
viewed_back = build("viewed_back")
not_transposed_back = build("not_transposed_back")
scatter_untransposed = build("scatter_untransposed")
bias_before_scatter = build("bias_before_scatter")
"""
CORRECT = ["transposed", "permuted"]
WRONG = ["wrong_dims_back", "viewed_back", "not_transposed_back", "scatter_untransposed", "bias_before_scatter"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sequence-first")
    (root / "sequence_first.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "tinymlp.model:build"\n'
        f'parallel = "sequence_first:{name}"\ninputs = "sequence_first:square_inputs"\nworld-sizes = [2, 4]\n'
        'outputs = "replicated"\n\n'
        for name in CORRECT + WRONG
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = [".", "{TINY.as_posix()}"]\n\n{checks}')
    return root


def _results(project: Path, name: str, sandbox) -> list:
    loaded = load_project(project)
    result = verify_check(loaded.check(name), loaded, None, sandbox)
    assert result.error is None, result.error
    return result.results


@pytest.mark.parametrize("name", CORRECT)
def test_partial_sums_scattered_sequence_first_and_permuted_back_are_verified(
    project: Path, name: str, sandbox
) -> None:
    results = _results(project, name, sandbox)
    assert [(r.world_size, r.verdict) for r in results] == [(2, "verified"), (4, "verified")]


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_layout_or_an_early_bias_is_a_discrepancy_the_numbers_show(project: Path, name: str, sandbox) -> None:
    results = _results(project, name, sandbox)
    assert [(r.world_size, r.verdict) for r in results] == [(2, "discrepancy"), (4, "discrepancy")]
    for outcome in results:
        finding = outcome.discrepancies[0]
        assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness
        assert finding.primary is not None and finding.primary.file.endswith("sequence_first.py")
