"""Expert parallelism without all-to-all (DeepSpeed-MoE / Megatron's expert-parallel MLP): each
rank accumulates its own experts' outputs from zeros and one all-reduce adds the ranks' sums,
where the reference accumulates every expert in one chain. Verified as sums of the same terms
(verify/sum_forms.py); a rank that skips, repeats or mis-indexes an expert, or an output reduced
twice or not at all, is a discrepancy."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "frameworks"

PROGRAM = """
import torch
import torch.distributed as dist
from torch import nn

from frameworks.models import EXPERTS


class ExpertParallel(nn.Module):
    def __init__(self, ref, rank, world_size, variant):
        super().__init__()
        per_rank = EXPERTS // world_size
        self.first, self.variant = rank * per_rank, variant
        self.router, self.route = ref.router, ref.route
        ids = list(range(self.first, self.first + per_rank))
        if variant == "skips" and rank == world_size - 1:
            ids = ids[:-1]
        if variant == "repeats" and rank == world_size - 1:
            ids = [*ids, 0]
        self.ids = ids
        self.experts = nn.ModuleList(ref.experts[i] for i in ids)

    def forward(self, x):
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for expert_id, expert in zip(self.ids, self.experts):
            index = expert_id - self.first if self.variant == "local-index" else expert_id
            mask = chosen == index
            if self.variant == "cast-mask":  # 1.0 where routed, 0.0 elsewhere: the same mask
                mask = mask.to(weights.dtype)
            gate = (weights * mask).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        if self.variant != "not-reduced":
            dist.all_reduce(out)
        if self.variant == "reduced-twice":
            dist.all_reduce(out)
        return out


def build(variant):
    return lambda ref, rank, world_size: ExpertParallel(ref, rank, world_size, variant)


correct = build("correct")
cast_mask = build("cast-mask")
skips = build("skips")
repeats = build("repeats")
local_index = build("local-index")
not_reduced = build("not-reduced")
reduced_twice = build("reduced-twice")
"""
VARIANTS = ["skips", "repeats", "local_index", "not_reduced", "reduced_twice"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("expert-sums")
    (root / "experts.py").write_text(textwrap.dedent(PROGRAM))
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "frameworks.models:moe"\n'
        f'parallel = "experts:{name}"\ninputs = "frameworks.models:tokens"\nworld-sizes = [2, 4]\n'
        'outputs = "replicated"\n\n'
        for name in ["correct", "cast_mask", *VARIANTS]
    )
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = [".", "{CORPUS.as_posix()}"]\n\n{checks}')
    return root


def _verdicts(project: Path, name: str, sandbox) -> list[tuple[int, str]]:
    loaded = load_project(project)
    result = verify_check(loaded.check(name), loaded, None, sandbox)
    assert result.error is None, result.error
    return [(r.world_size, r.verdict) for r in result.results]


@pytest.mark.parametrize("name", ["correct", "cast_mask"])
def test_per_rank_sums_of_whole_experts_all_reduced_are_verified(project: Path, name: str, sandbox) -> None:
    assert _verdicts(project, name, sandbox) == [(2, "verified"), (4, "verified")]


@pytest.mark.parametrize("name", VARIANTS)
def test_a_wrong_set_of_terms_is_a_discrepancy(project: Path, name: str, sandbox) -> None:
    assert _verdicts(project, name, sandbox) == [(2, "discrepancy"), (4, "discrepancy")]
