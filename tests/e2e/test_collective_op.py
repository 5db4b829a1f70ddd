"""An all-reduce or a reduce-scatter with the wrong operation (AVG or MAX where the ranks' partial
sums need SUM) is a `wrong-collective-op` discrepancy at the collective call, shown by the numeric
witness (whose threaded ranks emulate the reduce-scatter reductions torch's group lacks), and SUM
there is no discrepancy."""

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
from torch import nn


class RowParallel(nn.Module):
    def __init__(self, ref, rank, world_size, op):
        super().__init__()
        step = ref.up.out_features // world_size
        rows = slice(rank * step, (rank + 1) * step)
        self.up_w = nn.Parameter(ref.up.weight[rows].clone())
        self.up_b = nn.Parameter(ref.up.bias[rows].clone())
        self.down_w = nn.Parameter(ref.down.weight[:, rows].clone())
        self.down_b = ref.down.bias
        self.op = op

    def forward(self, x):
        partial = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(partial, op=self.op)
        return partial + self.down_b


def summed(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, dist.ReduceOp.SUM)


def averaged(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, dist.ReduceOp.AVG)


def maximum(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, dist.ReduceOp.MAX)


class SequenceScattered(RowParallel):
    # the partial sums reduce-scattered over the sequence (put first), the bias added to each
    # rank's positions, the positions all-gathered back

    def forward(self, x):
        partial = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w).transpose(0, 1).contiguous()
        world_size = dist.get_world_size()
        local = torch.empty((partial.shape[0] // world_size, *partial.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(local, partial, op=self.op)
        full = torch.empty_like(partial)
        dist.all_gather_into_tensor(full, (local + self.down_b).contiguous())
        return full.transpose(0, 1)


def scattered_sum(ref, rank, world_size):
    return SequenceScattered(ref, rank, world_size, dist.ReduceOp.SUM)


def scattered_max(ref, rank, world_size):
    return SequenceScattered(ref, rank, world_size, dist.ReduceOp.MAX)


def scattered_min(ref, rank, world_size):
    return SequenceScattered(ref, rank, world_size, dist.ReduceOp.MIN)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("collective-op")
    (root / "rowparallel.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "tinymlp.model:build"\n'
        f'parallel = "rowparallel:{name}"\ninputs = "tinymlp.model:inputs"\nworld-sizes = [2]\n'
        'outputs = "replicated"\n\n'
        for name in ("summed", "averaged", "maximum", "scattered_sum", "scattered_max", "scattered_min")
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = [".", "{TINY.as_posix()}"]\n\n{checks}')
    return root


def test_sum_is_verified(project: Path, sandbox) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check("summed"), loaded, None, sandbox).results
    assert outcome.verdict == "verified", outcome.summary


@pytest.mark.parametrize(("name", "op"), [("averaged", "AVG"), ("maximum", "MAX")])
def test_another_op_is_reported_at_the_all_reduce(project: Path, name: str, op: str, sandbox) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check(name), loaded, None, sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert found.kind == "wrong-collective-op"
    assert f"op={op}" in found.message and "SUM" in found.suggestion
    source = (project / "rowparallel.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "all_reduce" in text)
    assert (Path(found.primary.file).name, found.primary.line) == ("rowparallel.py", line)
    assert found.primary.column is not None


@pytest.mark.parametrize(("name", "op"), [("scattered_max", "MAX"), ("scattered_min", "MIN")])
def test_another_op_is_reported_at_the_reduce_scatter_with_a_witness(
    project: Path, name: str, op: str, sandbox
) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check(name), loaded, None, sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert found.kind == "wrong-collective-op"
    assert "reduce-scatter" in found.message and f"op={op}" in found.message and "SUM" in found.suggestion
    assert found.witness["status"] == "confirmed", found.witness
    source = (project / "rowparallel.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "reduce_scatter_tensor" in text)
    assert (Path(found.primary.file).name, found.primary.line) == ("rowparallel.py", line)


def test_a_reduce_scatter_that_sums_is_no_discrepancy(project: Path, sandbox) -> None:
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check("scattered_sum"), loaded, None, sandbox).results
    assert outcome.verdict != "discrepancy", outcome.summary
