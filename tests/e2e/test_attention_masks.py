"""`scaled_dot_product_attention` with an explicit mask is written out as torch applies it (a
row left without a key is zeros): a causal mask meets `is_causal=True`, and a mask that keeps
other keys is a discrepancy at the line that builds it (tests/corpus/unusual, written_out.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "unusual"
VARIANTS = """
from unusual.written_out import MaskedSdpaHeads


def earlier_keys(ref, rank, world_size):
    return MaskedSdpaHeads(ref, rank, world_size, "boolean", keep="earlier")


def later_keys(ref, rank, world_size):
    return MaskedSdpaHeads(ref, rank, world_size, "boolean", keep="later")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("masks")
    (root / "masks.py").write_text(VARIANTS)
    checks = "".join(
        f'[[tool.shardproof.check]]\nname = "{name}"\nreference = "unusual.models:attention"\n'
        f'parallel = "masks:{name}"\ninputs = "unusual.models:tokens"\nworld-sizes = [2]\noutputs = "replicated"\n\n'
        for name in ("earlier_keys", "later_keys")
    )
    corpus = CORPUS.as_posix()
    (root / "pyproject.toml").write_text(f'[tool.shardproof]\npython-path = [".", "{corpus}"]\n\n{checks}')
    return root


def _outcome(project: Path, name: str, sandbox):
    loaded = load_project(project)
    (outcome,) = verify_check(loaded.check(name), loaded, None, sandbox).results
    return outcome


def _line_of(text: str) -> int:
    source = (CORPUS / "unusual" / "written_out.py").read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if text in line)


def test_a_mask_that_leaves_out_each_query_s_own_key_is_reported_where_it_is_built(project: Path, sandbox) -> None:
    outcome = _outcome(project, "earlier_keys", sandbox)
    assert outcome.verdict == "discrepancy", outcome.summary
    (found,) = outcome.discrepancies
    assert found.kind == "wrong-constant", found.message
    assert (Path(found.primary.file).name, found.primary.line) == ("written_out.py", _line_of(".tril(diagonal=-1)"))


def test_a_mask_that_keeps_the_later_keys_is_a_discrepancy(project: Path, sandbox) -> None:
    outcome = _outcome(project, "later_keys", sandbox)
    assert outcome.verdict == "discrepancy", outcome.summary
