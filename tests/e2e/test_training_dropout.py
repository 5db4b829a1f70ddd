"""The forward is verified in eval mode (README Limits): modules run with `training` off, and a
dropout forced on (`training=True`) is taken as the identity, which the report says at its line:
a random mask is no function of the inputs, so the verdict covers the eval-mode forward only."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check
from shardproof.report.text import render

pytestmark = pytest.mark.slow

PROGRAM = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(F.dropout(F.gelu(self.up(x)), 0.1, training=self.forced or self.training))


class RowParallel(nn.Module):
    def __init__(self, ref, rank, world_size):
        super().__init__()
        rows = slice(rank * 32 // world_size, (rank + 1) * 32 // world_size)
        self.up_w = nn.Parameter(ref.up.weight[rows].clone())
        self.up_b = nn.Parameter(ref.up.bias[rows].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, rows].clone())
        self.down_b = nn.Parameter(ref.down.bias.clone())

    def forward(self, x):
        h = F.dropout(F.gelu(F.linear(x, self.up_w, self.up_b)), 0.1, training=self.forced or self.training)
        out = F.linear(h, self.down_w)
        dist.all_reduce(out)
        return out + self.down_b


def build(forced):
    def make():
        module = MLP()
        module.forced = forced
        return module
    return make


def parallel(forced):
    def make(ref, rank, world_size):
        module = RowParallel(ref, rank, world_size)
        module.forced = forced
        return module
    return make


reference_train, reference_eval = build(True), build(False)
parallel_train, parallel_eval = parallel(True), parallel(False)


def inputs():
    return (torch.randn(2, 4, 16),)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("training-dropout")
    (root / "mlp.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{mode}"\nreference = "mlp:reference_{mode}"\n'
        f'parallel = "mlp:parallel_{mode}"\ninputs = "mlp:inputs"\nworld-sizes = [2]\noutputs = "replicated"\n\n'
        for mode in ("train", "eval")
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = ["."]\n\n{checks}')
    return root


def test_training_mode_dropout_is_named_as_taken_for_the_identity(project: Path, sandbox) -> None:
    loaded = load_project(project)
    result = verify_check(loaded.check("train"), loaded, None, sandbox)
    (outcome,) = result.results
    assert outcome.verdict == "verified"
    lines = sorted({note.split(" taken")[0] for note in outcome.notes})
    assert lines == ["dropout in training mode at mlp.py:15", "dropout in training mode at mlp.py:28"]
    assert "note: dropout in training mode at mlp.py:15 taken as the identity" in render([result], project)


def test_dropout_following_the_module_mode_needs_no_note(project: Path, sandbox) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check("eval"), loaded, None, sandbox).results
    assert outcome.verdict == "verified" and outcome.notes == []
