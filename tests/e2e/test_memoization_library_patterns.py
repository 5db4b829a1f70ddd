"""Repeated blocks verified once, written the way real libraries write them: blocks called with
keyword tensors (transformers' decoder layers receive the mask, the positions and the rotary
tables by keyword: five tensors and more), a forward that skips an eager-only check on values
while it is traced (transformers' masking code asks `torch.compiler.is_compiling()`), and a
parallel program verified against its own code at world size 1 (fairscale, Megatron-core). Each
is verified one block for all its layers, and a mistake in one layer, or in what one layer is
given, is still not verified."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

KEYWORD_BLOCKS = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

LAYERS, DIM, HIDDEN, SEQ = 6, 8, 16, 4


def tables(seq):
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * torch.arange(1, DIM + 1, dtype=torch.float32) / DIM
    return angles.cos(), angles.sin()


def prepare(x):
    \"\"\"What every layer is given, as a decoder prepares it once.\"\"\"
    seq = x.shape[1]
    cos, sin = tables(seq)
    mask = (torch.arange(seq) % 3 == 2)[:, None]
    if not torch.compiler.is_compiling():
        # an eager-only check on values, skipped while traced (as transformers' masking does)
        assert not bool(mask.all()), "every position masked"
    return {"cos": cos, "sin": sin, "mask": mask, "scale": torch.full((1,), 0.5)}


def rotate(x, cos, sin, mask, scale):
    return (x * cos + x.flip(-1) * sin).masked_fill(mask, 0.0) * scale


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x, *, cos, sin, mask, scale):
        return x + self.down(torch.relu(self.up(rotate(x, cos, sin, mask, scale))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        given = prepare(x)
        for layer in self.layers:
            x = layer(x, **given)
        return x


class ParallelBlock(nn.Module):
    def __init__(self, block, index, rank, world_size):
        super().__init__()
        self.index = index
        rows = HIDDEN // world_size
        self.up = nn.Parameter(block.up.weight[rank * rows : (rank + 1) * rows].clone())
        self.down = nn.Parameter(block.down.weight[:, rank * rows : (rank + 1) * rows].clone())

    def forward(self, x, *, cos, sin, mask, scale):
        partial = F.linear(torch.relu(F.linear(rotate(x, cos, sin, mask, scale), self.up)), self.down)
        if self.index != -1:
            dist.all_reduce(partial)
        return x + partial


class ParallelModel(nn.Module):
    def __init__(self, model, rank, world_size):
        super().__init__()
        self.layers = nn.ModuleList(ParallelBlock(b, i, rank, world_size) for i, b in enumerate(model.layers))

    def forward(self, x):
        given = prepare(x)
        for index, layer in enumerate(self.layers):
            x = layer(x, **given)
        return x


def build():
    return Model()


def parallelize(model, rank, world_size):
    return ParallelModel(model, rank, world_size)


def inputs():
    return (torch.randn(2, SEQ, DIM, generator=torch.Generator().manual_seed(0)),)
"""

# The same layers written once for any world size, verified against themselves at world size 1.
SAME_CODE = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

LAYERS, DIM, HIDDEN = 6, 8, 16


class Block(nn.Module):
    def __init__(self, index, world_size):
        super().__init__()
        self.index = index
        self.up = nn.Parameter(torch.randn(HIDDEN // world_size, DIM))
        self.down = nn.Parameter(torch.randn(DIM, HIDDEN // world_size))

    def forward(self, x):
        partial = F.linear(torch.relu(F.linear(x, self.up)), self.down)
        if self.index != -1:
            dist.all_reduce(partial)
        return x + partial


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        world_size = dist.get_world_size()
        self.layers = nn.ModuleList(Block(i, world_size) for i in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build():
    torch.manual_seed(0)
    return Model()


def inputs():
    return (torch.randn(2, 4, DIM, generator=torch.Generator().manual_seed(0)),)
"""


def _project(root: Path, source: str, same_code: bool = False):
    (root / "deep.py").write_text(textwrap.dedent(source))
    entry = (
        'parallel = "deep:build"\nreference = { world-size = 1 }\n'
        if same_code
        else 'reference = "deep:build"\nparallel = "deep:parallelize"\n'
    )
    (root / "pyproject.toml").write_text(
        '[tool.shardproof]\npython-path = ["."]\n\n[[tool.shardproof.check]]\nname = "deep"\n'
        f'{entry}inputs = "deep:inputs"\nworld-sizes = [2, 4]\noutputs = "replicated"\n'
    )
    return load_project(root)


def _line(source: str, text: str) -> int:
    return next(i + 1 for i, line in enumerate(textwrap.dedent(source).splitlines()) if text in line)


@pytest.mark.parametrize(("source", "same_code"), [(KEYWORD_BLOCKS, False), (SAME_CODE, True)])
def test_library_style_layers_are_verified_one_block_for_all(source: str, same_code: bool, tmp_path: Path, sandbox):
    project = _project(tmp_path, source, same_code)
    result = verify_check(project.check("deep"), project, None, sandbox)
    assert [r.verdict for r in result.results] == ["verified", "verified"], [r.summary for r in result.results]
    for r in result.results:
        assert r.stats["templates"] == 1 and r.stats["block_instances"] == 6, r.stats


@pytest.mark.parametrize(("source", "same_code"), [(KEYWORD_BLOCKS, False), (SAME_CODE, True)])
def test_one_layer_without_its_all_reduce_is_found_at_its_line(
    source: str, same_code: bool, tmp_path: Path, sandbox
) -> None:
    wrong = source.replace("self.index != -1", "self.index != 4")
    project = _project(tmp_path, wrong, same_code)
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.kind == "missing-reduction"
    assert (Path(finding.primary.file).name, finding.primary.line) == ("deep.py", _line(wrong, "partial = F.linear"))
    assert "layers.4" in finding.message


def test_a_layer_given_another_keyword_tensor_is_not_verified(tmp_path: Path, sandbox) -> None:
    # every layer is the same computation, but the parallel program hands layer 3 the cosine table
    # as its sine table: a block call's keyword tensors are among its operands (five of them here)
    wrong = KEYWORD_BLOCKS.replace(
        "            x = layer(x, **given)\n        return x\n\n\ndef build",
        "            x = layer(x, **(given | {'sin': given['cos']} if index == 3 else given))\n"
        "        return x\n\n\ndef build",
    )
    assert wrong != KEYWORD_BLOCKS
    project = _project(tmp_path, wrong)
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox).results
    assert outcome.verdict != "verified", outcome.summary
