"""An all-reduce spelled as an all-gather of the partial sums, a view that stacks them along a new
dim and a sum over it (or `torch.stack` of the chunks) is verified: the view of the gathered
buffer is, position by position, the ranks' values stacked (relayout.py evaluates it on index
tensors). A mean in place of the sum, a view that mixes rows of different ranks, or one rank's
piece alone is a discrepancy."""

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


class GatheredSum(ParallelMLP):
    def __init__(self, ref, rank, world_size, variant):
        super().__init__(ref, rank, world_size)
        self.variant = variant

    def forward(self, x):
        partial = F.linear(self.hidden(x), self.down_w)
        world_size = dist.get_world_size()
        shape = partial.shape
        gathered = torch.empty((world_size * shape[0], *shape[1:]), dtype=partial.dtype, device=partial.device)
        dist.all_gather_into_tensor(gathered, partial)
        if self.variant == "stacked":
            return torch.stack(list(gathered.chunk(world_size, 0)), 0).sum(0) + self.down_b
        if self.variant == "mean":
            return gathered.view(world_size, *shape).mean(0) + self.down_b
        if self.variant == "mixed_rows":
            return gathered.view(shape[0], world_size, *shape[1:]).sum(1) + self.down_b
        if self.variant == "one_piece":
            return gathered.view(world_size, *shape)[0] + self.down_b
        return gathered.view(world_size, *shape).sum(0) + self.down_b


def build(variant):
    return lambda ref, rank, world_size: GatheredSum(ref, rank, world_size, variant)


viewed = build("viewed")
stacked = build("stacked")
mean = build("mean")
mixed_rows = build("mixed_rows")
one_piece = build("one_piece")
"""
CORRECT = ["viewed", "stacked"]
WRONG = ["mean", "mixed_rows", "one_piece"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gathered-sums")
    (root / "gathered.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "tinymlp.model:build"\n'
        f'parallel = "gathered:{name}"\ninputs = "tinymlp.model:inputs"\nworld-sizes = [2, 4]\n'
        'outputs = "replicated"\n\n'
        for name in CORRECT + WRONG
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = [".", "{TINY.as_posix()}"]\n\n{checks}')
    return root


def _verdicts(project: Path, name: str, sandbox) -> list[tuple[int, str]]:
    loaded = load_project(project)
    result = verify_check(loaded.check(name), loaded, None, sandbox)
    assert result.error is None, result.error
    return [(r.world_size, r.verdict) for r in result.results]


@pytest.mark.parametrize("name", CORRECT)
def test_partial_sums_gathered_stacked_and_summed_are_verified(project: Path, name: str, sandbox) -> None:
    assert _verdicts(project, name, sandbox) == [(2, "verified"), (4, "verified")]


@pytest.mark.parametrize("name", WRONG)
def test_anything_but_their_sum_is_a_discrepancy(project: Path, name: str, sandbox) -> None:
    assert _verdicts(project, name, sandbox) == [(2, "discrepancy"), (4, "discrepancy")]
