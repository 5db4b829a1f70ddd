"""A coalesced all-reduce: values flattened into one buffer, reduced once, sliced back out. The
reduction of a buffer every rank concatenates alike is the concatenation of the pieces' sums, so
each value is proven like one all-reduced on its own; unpacked at the wrong offset it is a
discrepancy at the slice (the localization corpus's `coalesced-unpacked-off-by-one`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "localization"
BUG = "mlp = buffer[n - 1 : 2 * n - 1].view_as(mlp) + self.down_b"


def test_the_law_on_numbers() -> None:
    ranks = [(torch.randn(6), torch.randn(4)) for _ in range(3)]
    reduced = sum(torch.cat(pieces) for pieces in ranks)
    assert torch.allclose(reduced, torch.cat([sum(a for a, _ in ranks), sum(b for _, b in ranks)]))


@pytest.mark.parametrize(
    "unpacked, verdict",
    [("mlp = buffer[n : 2 * n].view_as(mlp) + self.down_b", "verified"), (BUG, "discrepancy")],
)
def test_two_values_reduced_in_one_buffer(unpacked: str, verdict: str, tmp_path: Path, sandbox) -> None:
    root = tmp_path / "corpus"
    shutil.copytree(CORPUS, root, ignore=shutil.ignore_patterns("__pycache__"))
    buffers = root / "localization" / "buffers.py"
    buffers.write_text(buffers.read_text().replace(BUG, unpacked))
    project = load_project(root)
    (outcome,) = verify_check(project.check("coalesced-unpacked-off-by-one"), project, [2], sandbox).results
    assert outcome.verdict == verdict, outcome.summary
    if verdict == "discrepancy":
        (finding,) = outcome.discrepancies
        line = buffers.read_text().splitlines().index("        " + BUG) + 1
        assert (Path(finding.primary.file).name, finding.primary.line) == ("buffers.py", line)
        assert "[256:512]" in finding.message and finding.kind == "wrong-layout"


def test_the_bias_added_after_the_residual_is_the_same_sum(tmp_path: Path, sandbox) -> None:
    # (x + attn + mlp) + bias, where the reference adds the bias to the MLP's output first:
    # addition regrouped where the reference's grouping is a term (regroup-sum-as-written-elsewhere)
    root = tmp_path / "corpus"
    shutil.copytree(CORPUS, root, ignore=shutil.ignore_patterns("__pycache__"))
    buffers = root / "localization" / "buffers.py"
    text = buffers.read_text().replace(BUG, "mlp = buffer[n : 2 * n].view_as(mlp)")
    text = text.replace("return x + attn + mlp\n", "return x + attn + mlp + self.down_b\n")
    assert text.count("self.down_b\n") == 1
    buffers.write_text(text)
    project = load_project(root)
    (outcome,) = verify_check(project.check("coalesced-unpacked-off-by-one"), project, [2], sandbox).results
    assert outcome.verdict == "verified", outcome.summary
