"""An operation that needs the full value (a norm, an activation) applied to a partial sum before
its all-reduce is reported at that operation's line: the fix is to reduce first."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

PROGRAM = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16, bias=False)
        self.norm = nn.RMSNorm(16)

    def forward(self, x):
        return F.silu(self.norm(self.down(F.gelu(self.up(x)))))


def build():
    return Block()


def inputs():
    return (torch.randn(2, 8, 16),)


class RowParallel(nn.Module):
    def __init__(self, ref, rank, world_size, variant):
        super().__init__()
        step = 32 // world_size
        rows = slice(rank * step, (rank + 1) * step)
        self.up_w = nn.Parameter(ref.up.weight[rows].clone())
        self.up_b = nn.Parameter(ref.up.bias[rows].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, rows].clone())
        self.norm, self.variant = ref.norm, variant

    def forward(self, x):
        partial = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        if self.variant == "norm_first":
            normed = self.norm(partial)  # LINE: norm_first
            dist.all_reduce(normed)
            return F.silu(normed)
        if self.variant == "both_first":
            out = F.silu(self.norm(partial))  # LINE: both_first
            dist.all_reduce(out)
            return out
        dist.all_reduce(partial)
        return F.silu(self.norm(partial))


def build_parallel(variant):
    return lambda ref, rank, world_size: RowParallel(ref, rank, world_size, variant)


correct = build_parallel("correct")
norm_first = build_parallel("norm_first")
both_first = build_parallel("both_first")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("applied-before-reduction")
    (root / "block.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "block:build"\nparallel = "block:{name}"\n'
        'inputs = "block:inputs"\nworld-sizes = [2]\noutputs = "replicated"\n\n'
        for name in ("correct", "norm_first", "both_first")
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = ["."]\n\n{checks}')
    return root


def test_reducing_first_is_verified(project: Path, sandbox) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check("correct"), loaded, None, sandbox).results
    assert outcome.verdict == "verified", outcome.summary


@pytest.mark.parametrize("name", ["norm_first", "both_first"])
def test_a_norm_before_the_all_reduce_is_reported_at_the_norm(project: Path, name: str, sandbox) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check(name), loaded, None, sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert found.kind == "partial-sum-into-nonlinear" and "before the all-reduce" in found.message
    source = (project / "block.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.endswith(f"# LINE: {name}"))
    assert (Path(found.primary.file).name, found.primary.line) == ("block.py", line)
    assert "reduce first" in found.suggestion.replace("all-reduce first", "reduce first")
