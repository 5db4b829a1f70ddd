"""fairscale (from PyPI): one parallel model, the same code at world size 1 as the reference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2] / "examples" / "fairscale_llama"


def _bug_variants():
    name = "fairscale_bug_variants"  # the llama example's bug_variants is on sys.path already
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bug_variants.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize("name", ["fairscale-llama3", "fairscale-llama2"])
def test_fairscale_llama_is_verified_against_itself_at_world_size_1(name: str, sandbox) -> None:
    # llama3: VocabParallelEmbedding (vocabulary shards, masked lookups summed by an all-reduce);
    # llama2: ParallelEmbedding (model-dim shards, all-gathered). Both: Column/RowParallelLinear.
    project = load_project(ROOT)
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
    bugs = _bug_variants()
    root = tmp_path_factory.mktemp("fairscale-variants")
    return {v.name: bugs.materialize(v, root / v.name) for v in bugs.VARIANTS}


@pytest.mark.parametrize("name", ["copy-instead-of-reduce", "lm-head-not-gathered"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_fairscale_mistake_is_reported_at_the_users_line(name: str, world_size: int, variant_projects, sandbox) -> None:
    bugs = _bug_variants()
    bug = next(v for v in bugs.VARIANTS if v.name == name)
    root = variant_projects[name]
    project = load_project(root)
    result = verify_check(project.check("fairscale-llama3"), project, [world_size], sandbox)
    (outcome,) = result.results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.kind == bug.kind, finding.message
    assert finding.primary is not None
    # In the user's model, never inside fairscale; fairscale's own line is related information.
    assert Path(finding.primary.file) == root / bug.file
    assert finding.primary.line == bug.line_number(root), finding.message
    assert "site-packages" not in finding.primary.file
    # No witness yet for this pattern, and the report says why rather than claiming one.
    assert finding.witness is not None and finding.witness["status"] == "unconfirmed"
    assert "world size 1" in finding.witness["reason"]


def test_a_library_frame_is_related_information_not_the_site(variant_projects, sandbox) -> None:
    root = variant_projects["lm-head-not-gathered"]
    project = load_project(root)
    result = verify_check(project.check("fairscale-llama3"), project, [2], sandbox)
    finding = result.results[0].discrepancies[0]
    inside = [s for s in finding.related if "fairscale" in s.file]
    assert inside and inside[0].note.startswith("inside fairscale"), finding.related
