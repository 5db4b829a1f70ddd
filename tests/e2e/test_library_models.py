"""Real-world parallel code from PyPI (fairscale, Megatron-core): one parallel model, the same
code at world size 1 as the reference; mistakes reported at the user's line."""

from __future__ import annotations

from pathlib import Path

import pytest
from realworld_variants import EXAMPLES, VARIANTS

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("example", "name"),
    [
        # VocabParallelEmbedding: vocabulary shards, masked lookups summed by an all-reduce
        ("fairscale_llama", "fairscale-llama3"),
        # ParallelEmbedding: model-dim shards, all-gathered
        ("fairscale_llama", "fairscale-llama2"),
        # Megatron-core's Column/RowParallelLinear and VocabParallelEmbedding, fused per-head QKV
        ("megatron_gpt", "megatron-tp"),
        # the same with sequence parallelism: scatter, all-gather and reduce-scatter on the sequence dim
        ("megatron_gpt", "megatron-sp"),
    ],
)
def test_library_model_is_verified_against_itself_at_world_size_1(example: str, name: str, sandbox) -> None:
    project = load_project(EXAMPLES / example)
    check = project.check(name)
    assert check.same_code_reference
    result = verify_check(check, project, [2, 4], sandbox)
    assert result.error is None, result.error
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]
    for r in result.results:
        assert [o.relation for o in r.outputs] == ["replicated"]


@pytest.fixture(scope="module")
def variant_projects(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("realworld-variants")
    return {v.name: v.materialize(root / v.name) for v in VARIANTS}


@pytest.mark.parametrize("name", [v.name for v in VARIANTS])
@pytest.mark.parametrize("world_size", [2, 4])
def test_library_mistake_is_reported_at_the_users_line(name: str, world_size: int, variant_projects, sandbox) -> None:
    bug = next(v for v in VARIANTS if v.name == name)
    root = variant_projects[name]
    project = load_project(root)
    result = verify_check(project.check(bug.check), project, [world_size], sandbox)
    (outcome,) = result.results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.kind == bug.kind, finding.message
    assert finding.primary is not None
    # In the user's model, never inside the library.
    assert Path(finding.primary.file) == root / bug.file
    assert finding.primary.line == bug.line_number(root), finding.message
    assert "site-packages" not in finding.primary.file
    # No witness yet for this pattern, and the report says why rather than claiming one.
    assert finding.witness is not None and finding.witness["status"] == "unconfirmed"
    assert "world size 1" in finding.witness["reason"]


def test_a_library_frame_is_related_information_not_the_site(variant_projects, sandbox) -> None:
    root = variant_projects["fairscale-lm-head-not-gathered"]
    project = load_project(root)
    result = verify_check(project.check("fairscale-llama3"), project, [2], sandbox)
    finding = result.results[0].discrepancies[0]
    inside = [s for s in finding.related if "fairscale" in s.file]
    assert inside and inside[0].note.startswith("inside fairscale"), finding.related
