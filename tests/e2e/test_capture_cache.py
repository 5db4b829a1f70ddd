"""Stored captures (capture/capture_cache.py): a rank's capture is reused only while every file
it read and every environment variable its code read is unchanged. Each edit below is one a user
makes (the parallel code, a helper module it imports, the model, a setting in the environment);
each must capture the ranks again, and where it changes the computation the verdict follows it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.capture.memoized import warm_up_tracing
from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

MODEL = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return x + self.proj(x)


class Model(nn.Module):
    def __init__(self, layers=4):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build():
    return Model()


def inputs():
    return (torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0)),)
"""

HELPER = """
import torch.distributed as dist


def reduce(partial):
    dist.all_reduce(partial)
    return partial
"""

PARALLEL = """
import os

import torch.nn.functional as F
from torch import nn

from comm import reduce


class ParallelBlock(nn.Module):
    def __init__(self, block, rank, world_size, skip_reduce):
        super().__init__()
        columns = block.proj.weight.shape[1] // world_size
        self.proj = nn.Parameter(block.proj.weight[:, rank * columns : (rank + 1) * columns].clone())
        self.rank, self.columns, self.skip_reduce = rank, columns, skip_reduce

    def forward(self, x):
        local = x[..., self.rank * self.columns : (self.rank + 1) * self.columns]
        partial = F.linear(local, self.proj)
        if not self.skip_reduce:
            partial = reduce(partial)
        return x + partial


class ParallelModel(nn.Module):
    def __init__(self, model, rank, world_size):
        super().__init__()
        skip = os.environ.get("DEEP_SKIP_REDUCE") == "1"
        self.layers = nn.ModuleList(ParallelBlock(b, rank, world_size, skip) for b in model.layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def parallelize(model, rank, world_size):
    return ParallelModel(model, rank, world_size)
"""

PYPROJECT = """
[tool.shardproof]
python-path = ["."]

[[tool.shardproof.check]]
name = "deep"
reference = "model:build"
parallel = "parallel:parallelize"
inputs = "model:inputs"
world-sizes = [2]
outputs = "replicated"
"""


@pytest.fixture
def project_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # as the editor's worker does before its first run: torch's first trace sets a variable
    warm_up_tracing()
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEEP_SKIP_REDUCE", "0")
    root = tmp_path / "project"
    root.mkdir()
    for name, text in (("model.py", MODEL), ("comm.py", HELPER), ("parallel.py", PARALLEL)):
        (root / name).write_text(textwrap.dedent(text))
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


def _run(root: Path, sandbox) -> tuple[str, int | None]:
    """The verdict, and how many ranks were taken from stored captures (None: not memoized)."""
    project = load_project(root)
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox, numeric_witness=False).results
    return outcome.verdict, outcome.stats.get("stored_rank_captures")  # unproven: no witness runs here


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_second_run_reuses_every_rank_and_an_edit_of_the_parallel_code_none(project_root: Path, sandbox) -> None:
    assert _run(project_root, sandbox) == ("verified", 0)
    assert _run(project_root, sandbox) == ("verified", 2)
    parallel = project_root / "parallel.py"
    summed = "            partial = reduce(partial)  # summed over the ranks\n"
    _edit(parallel, "            partial = reduce(partial)\n", summed)
    assert _run(project_root, sandbox) == ("verified", 0)
    _edit(parallel, "        if not self.skip_reduce:\n" + summed, "")
    assert _run(project_root, sandbox)[0] == "unproven"  # the captures follow the edit
    # the edit undone: its captures were kept
    guarded = "        if not self.skip_reduce:\n" + summed
    _edit(parallel, "        return x + partial\n", guarded + "        return x + partial\n")
    assert _run(project_root, sandbox) == ("verified", 2)


def test_an_edit_of_a_helper_module_the_ranks_import_captures_them_again(project_root: Path, sandbox) -> None:
    assert _run(project_root, sandbox) == ("verified", 0)
    helper = project_root / "comm.py"
    _edit(helper, "dist.all_reduce(partial)", "dist.all_reduce(partial, op=dist.ReduceOp.SUM)")
    assert _run(project_root, sandbox) == ("verified", 0)
    _edit(helper, "    dist.all_reduce(partial, op=dist.ReduceOp.SUM)\n", "")
    assert _run(project_root, sandbox)[0] == "unproven"


def test_an_edit_of_the_model_captures_the_ranks_again(project_root: Path, sandbox) -> None:
    # the ranks are built from the reference model: its file is read by every rank's capture
    assert _run(project_root, sandbox) == ("verified", 0)
    _edit(project_root / "model.py", "def build():", "# the model\ndef build():")
    assert _run(project_root, sandbox) == ("verified", 0)


def test_a_variable_the_parallel_code_reads_captures_the_ranks_again(
    project_root: Path, sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run(project_root, sandbox) == ("verified", 0)
    monkeypatch.setenv("DEEP_SKIP_REDUCE", "1")
    assert _run(project_root, sandbox)[0] == "unproven"
    monkeypatch.setenv("DEEP_SKIP_REDUCE", "0")
    assert _run(project_root, sandbox) == ("verified", 2)
    monkeypatch.setenv("DEEP_UNRELATED_SETTING", "x")  # a variable nothing read does not matter
    assert _run(project_root, sandbox) == ("verified", 2)


def test_no_capture_is_stored_when_the_cache_is_off(project_root: Path, sandbox, monkeypatch) -> None:
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", "off")
    assert _run(project_root, sandbox) == ("verified", 0)
    assert _run(project_root, sandbox) == ("verified", 0)


def test_a_helper_module_of_another_project_never_stands_for_this_ones(tmp_path: Path, sandbox, monkeypatch) -> None:
    # Two projects import `from comm import reduce`; the first one's `comm` stays imported in a
    # long-lived process (the editor's worker). The second project's own helper must be used.
    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", "off")
    monkeypatch.setenv("DEEP_SKIP_REDUCE", "0")
    verdicts = []
    for name, helper in (("first", HELPER), ("second", HELPER.replace("    dist.all_reduce(partial)\n", ""))):
        root = tmp_path / name
        root.mkdir()
        for file, text in (("model.py", MODEL), ("comm.py", helper), ("parallel.py", PARALLEL)):
            (root / file).write_text(textwrap.dedent(text))
        (root / "pyproject.toml").write_text(PYPROJECT)
        verdicts.append(_run(root, sandbox)[0])
    assert verdicts == ["verified", "unproven"]
