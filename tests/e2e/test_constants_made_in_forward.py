"""Constants a forward makes itself: `torch.zeros(n)` without a device (a CPU tensor in the real
run) is captured on the meta device; a constant 0 divided by the world size, equal to each of its
shares, is verified (its shares once made ever larger divisors in egglog); a constant or an input added in
full on every rank before the sum is a discrepancy at that addition."""

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
from torch import nn

DIM = 16


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, 4 * DIM, bias=False)
        self.down = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + self.offset()

    def offset(self):
        return torch.ones(DIM)


class Zeroed(Mlp):
    def offset(self):
        return torch.zeros(DIM)


class Residual(Mlp):
    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + x


def build():
    return Mlp()


def build_zeroed():
    return Zeroed()


def build_residual():
    return Residual()


def inputs():
    return (torch.randn(2, 8, DIM),)


class RowParallel(nn.Module):
    def __init__(self, ref, rank, world_size, offset):
        super().__init__()
        width = 4 * DIM // world_size
        rows = slice(rank * width, (rank + 1) * width)
        self.up = nn.Parameter(ref.up.weight[rows].clone())
        self.down = nn.Parameter(ref.down.weight[:, rows].clone())
        self.world_size = world_size
        self.offset = offset

    def forward(self, x):
        y = torch.relu(x @ self.up.t()) @ self.down.t()
        if self.offset == "zero shares":
            y = y + torch.zeros(DIM) / self.world_size / 2 * 2
        elif self.offset == "one shares":
            y = y + torch.ones(DIM) / self.world_size
        elif self.offset == "residual":
            y = y + x  # LINE: residual on every rank
        else:
            y = y + torch.ones(DIM)  # LINE: added on every rank
        dist.all_reduce(y)
        return y


def zero_shares(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, "zero shares")


def one_shares(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, "one shares")


def ones_on_every_rank(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, "on every rank")


def residual_on_every_rank(ref, rank, world_size):
    return RowParallel(ref, rank, world_size, "residual")
"""

CHECKS = {
    "zero_shares": "build_zeroed",
    "one_shares": "build",
    "ones_on_every_rank": "build",
    "residual_on_every_rank": "build_residual",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("constants-in-forward")
    (root / "mlp.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "mlp:{build}"\n'
        f'parallel = "mlp:{name}"\ninputs = "mlp:inputs"\nworld-sizes = [2, 4]\noutputs = "replicated"\n\n'
        for name, build in CHECKS.items()
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = ["."]\n\n{checks}')
    return root


def _outcomes(project: Path, name: str, sandbox):
    loaded = load_project(project)
    return verify_check(loaded.check(name), loaded, None, sandbox).results


@pytest.mark.parametrize("name", ["zero_shares", "one_shares"])
def test_shares_of_a_constant_made_without_a_device_are_verified(project: Path, name: str, sandbox) -> None:
    for outcome in _outcomes(project, name, sandbox):
        assert outcome.verdict == "verified", outcome.summary


@pytest.mark.parametrize(
    ("name", "marker", "added"),
    [
        ("ones_on_every_rank", "added on every rank", "a constant"),
        ("residual_on_every_rank", "residual on every rank", "input 0 of the forward"),
    ],
)
def test_a_full_value_added_on_every_rank_before_the_sum_is_reported_at_its_line(
    project: Path, name: str, marker: str, added: str, sandbox
) -> None:
    source = (project / "mlp.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.endswith(f"# LINE: {marker}"))
    for outcome, world_size in zip(_outcomes(project, name, sandbox), (2, 4), strict=True):
        assert outcome.verdict == "discrepancy", outcome.summary
        found = outcome.discrepancies[0]
        assert found.kind == "bias-before-reduction"
        assert found.message.startswith(f"{added} is added to a partial sum on every rank"), found.message
        assert f"counted {world_size} times" in found.message
        assert (Path(found.primary.file).name, found.primary.line) == ("mlp.py", line), found.message
