"""A model too large to run with real numbers, verified block by block and not proven: the unit
that failed is localized (memoized_failure.py) instead of tracing every layer, with the same
verdict, kind and line as the plain run that traces every layer, and never a verdict the plain
run could not give."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_memoization import ONE_LAYER_WRONG, PARTIAL_UPDATE_CROSSES_BLOCKS, _deep_project

from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow


def _large(source: str) -> str:
    """The test model with blocks of 16 M parameter elements each: beyond the numeric witness's
    64 M in six layers, and as cheap to capture on meta tensors as the small one."""
    large = source.replace("dim=16, hidden=32", "dim=1024, hidden=8192").replace(
        "torch.randn(2, 4, 16,", "torch.randn(2, 4, 1024,"
    )
    assert large != source
    return large


def _seen(result) -> list[tuple]:
    return [
        (r.verdict, [(d.kind, Path(d.primary.file).name, d.primary.line) for d in [*r.discrepancies, *r.unproven]])
        for r in result.results
    ]


def _line(source: str, text: str) -> int:
    return next(i + 1 for i, line in enumerate(source.splitlines()) if text in line)


def test_a_mistake_in_the_blocks_is_found_in_the_first_block_without_tracing_every_layer(
    tmp_path: Path, sandbox
) -> None:
    # every layer skips its all-reduce (one template on every rank, not proven)
    source = _large(ONE_LAYER_WRONG).replace("self.index != 4", "False")
    project = _deep_project(tmp_path, source, "[2]")
    check = project.check("deep")
    memoized = verify_check(check, project, [2], sandbox)
    (outcome,) = memoized.results
    assert outcome.verdict == "unproven", outcome.summary
    (finding,) = outcome.unproven
    assert (finding.kind, Path(finding.primary.file).name, finding.primary.line) == (
        "missing-reduction",
        "deep.py",
        _line(source, "partial = F.linear"),
    )
    assert "layers.0" in finding.message and "--no-memoize" in finding.message
    assert "too many to run with real numbers" in finding.message
    assert outcome.stats["localized_in"].startswith("block layers.0 (one template for 6 repeated blocks)")
    plain = verify_check(check, project, [2], sandbox, memoize=False)
    assert _seen(memoized) == _seen(plain)


def test_a_mistake_outside_the_blocks_is_found_in_the_skeleton(tmp_path: Path, sandbox) -> None:
    # every layer right, the model's own final step wrong: its skeleton holds the mistake
    source = _large(ONE_LAYER_WRONG.replace("self.index != 4", "True")).replace(
        "            x = layer(x)\n        return x\n\n\ndef build",
        "            x = layer(x)\n        return x * (dist.get_rank() + 1)\n\n\ndef build",
    )
    project = _deep_project(tmp_path, source, "[2]")
    check = project.check("deep")
    memoized = verify_check(check, project, [2], sandbox)
    (outcome,) = memoized.results
    assert outcome.verdict in ("unproven", "discrepancy"), outcome.summary
    assert outcome.stats.get("localized_in") == "the program outside its repeated blocks", outcome.stats
    (finding,) = [*outcome.discrepancies, *outcome.unproven]
    assert finding.primary.line == _line(source, "return x * (dist.get_rank() + 1)")
    plain = verify_check(check, project, [2], sandbox, memoize=False)
    assert _seen(memoized) == _seen(plain)


def test_a_block_fed_what_its_proof_did_not_assume_is_left_to_the_plain_run(tmp_path: Path, sandbox) -> None:
    # every layer misses its all-reduce, and every rank scales the input before the first layer:
    # the skeleton does not prove what the first layer receives, so its block says nothing of the
    # model; the plain run finds the first mistake
    source = (
        _large(ONE_LAYER_WRONG)
        .replace("self.index != 4", "False")
        .replace(
            "    def forward(self, x):\n        for layer in self.layers:\n"
            "            x = layer(x)\n        return x\n\n\ndef build",
            "    def forward(self, x):\n        x = x * (dist.get_rank() + 1)\n        for layer in self.layers:\n"
            "            x = layer(x)\n        return x\n\n\ndef build",
        )
    )
    project = _deep_project(tmp_path, source, "[2]")
    check = project.check("deep")
    memoized = verify_check(check, project, [2], sandbox)
    (outcome,) = memoized.results
    assert "localized_in" not in outcome.stats, outcome.stats
    (finding,) = [*outcome.discrepancies, *outcome.unproven]
    assert finding.primary.line == _line(source, "x = x * (dist.get_rank() + 1)")


def test_a_correct_model_whose_blocks_hand_on_partial_sums_is_not_called_wrong(tmp_path: Path, sandbox) -> None:
    # Correct, but no block proves its output alone (the next block completes the sum): without
    # the plain run, the answer is `unproven` with the way to the proof, never a discrepancy.
    source = _large(PARTIAL_UPDATE_CROSSES_BLOCKS).replace("layers=3", "layers=4")
    project = _deep_project(tmp_path, source, "[2]")
    check = project.check("deep")
    (outcome,) = verify_check(check, project, [2], sandbox).results
    assert outcome.verdict == "unproven" and not outcome.discrepancies, outcome.summary
    assert "--no-memoize" in outcome.summary
    (plain,) = verify_check(check, project, [2], sandbox, memoize=False).results
    assert plain.verdict == "verified", plain.summary


def test_a_mistake_in_one_layer_of_many_is_found_in_that_layer(tmp_path: Path, sandbox) -> None:
    # layer 4 of 6 skips its all-reduce: the ranks record it apart from the others (the reference
    # does not), so it is a template of its own in every program, and the one that fails
    source = _large(ONE_LAYER_WRONG)
    project = _deep_project(tmp_path, source, "[2]")
    check = project.check("deep")
    memoized = verify_check(check, project, [2], sandbox)
    (outcome,) = memoized.results
    assert outcome.stats["localized_in"].startswith("block layers.4 (one template for 1 repeated blocks)")
    (finding,) = outcome.unproven
    assert (finding.kind, finding.primary.line) == ("missing-reduction", _line(source, "partial = F.linear"))
    assert "layers.4" in finding.message
    plain = verify_check(check, project, [2], sandbox, memoize=False)
    assert _seen(memoized) == _seen(plain)
