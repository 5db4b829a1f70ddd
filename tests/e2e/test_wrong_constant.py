"""A wrong constant (an attention scale computed from the rank's local sizes) is reported at the
assignment of the name the operation reads, with the operation as related information."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

PROGRAM = """
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DIM, HEADS = 32, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(DIM, DIM, bias=False)
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.v = nn.Linear(DIM, DIM, bias=False)
        self.o = nn.Linear(DIM, DIM, bias=False)
        self.heads = HEADS
        self.scale = 1 / math.sqrt(DIM // HEADS)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, -1).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, -1).transpose(1, 2)
        v = self.v(x).view(b, s, self.heads, -1).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1))


def build():
    return Attention()


def inputs():
    return (torch.randn(2, 8, DIM),)


class HeadParallel(nn.Module):
    def __init__(self, ref, rank, world_size, scale_from, scale_at="scores"):
        super().__init__()
        self.scale_at = scale_at
        width = DIM // world_size
        rows = slice(rank * width, (rank + 1) * width)
        self.q_w = nn.Parameter(ref.q.weight[rows].clone())
        self.k_w = nn.Parameter(ref.k.weight[rows].clone())
        self.v_w = nn.Parameter(ref.v.weight[rows].clone())
        self.o_w = nn.Parameter(ref.o.weight[:, rows].clone())
        self.heads = HEADS // world_size
        head_dim = width if scale_from == "local width" else width // self.heads
        self.scale = 1 / math.sqrt(head_dim)  # LINE: the scale

    def forward(self, x):
        b, s, _ = x.shape
        q = F.linear(x, self.q_w).view(b, s, self.heads, -1).transpose(1, 2)
        k = F.linear(x, self.k_w).view(b, s, self.heads, -1).transpose(1, 2)
        v = F.linear(x, self.v_w).view(b, s, self.heads, -1).transpose(1, 2)
        if self.scale_at == "queries":
            scores = (q * self.scale) @ k.transpose(-2, -1)
        else:
            scores = (q @ k.transpose(-2, -1)) * self.scale
        y = F.linear((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1), self.o_w)
        dist.all_reduce(y)
        return y


def head_width(ref, rank, world_size):
    return HeadParallel(ref, rank, world_size, "head width")


def local_width(ref, rank, world_size):
    return HeadParallel(ref, rank, world_size, "local width")


def head_width_on_queries(ref, rank, world_size):
    return HeadParallel(ref, rank, world_size, "head width", "queries")


def local_width_on_queries(ref, rank, world_size):
    return HeadParallel(ref, rank, world_size, "local width", "queries")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wrong-constant")
    (root / "attention.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "attention:build"\n'
        f'parallel = "attention:{name}"\ninputs = "attention:inputs"\nworld-sizes = [2]\noutputs = "replicated"\n\n'
        for name in ("head_width", "local_width", "head_width_on_queries", "local_width_on_queries")
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = ["."]\n\n{checks}')
    return root


def _outcome(project: Path, name: str, sandbox):
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check(name), loaded, None, sandbox).results
    return outcome


def test_the_scale_from_the_head_width_is_verified(project: Path, sandbox) -> None:
    outcome = _outcome(project, "head_width", sandbox)
    assert outcome.verdict == "verified", outcome.summary


def test_a_scale_from_the_local_width_is_reported_at_its_assignment(project: Path, sandbox) -> None:
    outcome = _outcome(project, "local_width", sandbox)
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert found.kind == "wrong-constant"
    assert "0.25 where the reference uses 0.353553 (self.scale)" in found.message
    source = (project / "attention.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.endswith("# LINE: the scale"))
    assert (Path(found.primary.file).name, found.primary.line) == ("attention.py", line)
    assert source[line - 1][found.primary.column - 1 : found.primary.end_column - 1] == "1 / math.sqrt(head_dim)"
    (uses,) = found.related
    assert "scores = " in source[uses.line - 1]


def test_the_scale_on_the_queries_before_the_scores_is_verified(project: Path, sandbox) -> None:
    # (q * c) @ k^T is (q @ k^T) * c: the reference scales the scores
    outcome = _outcome(project, "head_width_on_queries", sandbox)
    assert outcome.verdict == "verified", outcome.summary


def test_a_wrong_scale_on_the_queries_is_a_discrepancy(project: Path, sandbox) -> None:
    # Found, but not yet at the assignment: the scale moved onto the scores exists only in the
    # e-graph, and the wrong-constant detector reads the rank's graph (the report lands on the
    # product of the scaled queries and the keys).
    outcome = _outcome(project, "local_width_on_queries", sandbox)
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert Path(found.primary.file).name == "attention.py"
    assert found.witness is None or found.witness.get("status") != "agree"
