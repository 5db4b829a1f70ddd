"""Verdicts decided by evidence, and everywhere they show: exit codes and --fail-on, the text
report, SARIF, the witness's readable lines, and an unproven finding's wording."""

from __future__ import annotations

import pytest

from shardproof.graph.model import Graph, Node, Placeholder, TensorMeta
from shardproof.localize.unproven import as_unproven, shown
from shardproof.report import sarif, text
from shardproof.results import CheckResult, Discrepancy, Site, WorldSizeResult, exit_code
from shardproof.witness.describe import describe, headline, trials_summary

AGREE = {
    "status": "agree",
    "tolerance": 1e-6,
    "seconds": 0.2,
    "outputs": [{"where": "output 0", "max_abs": 1e-15, "max_rel": 1e-16}],
    "trials": [
        {"seed": seed, "inputs": inputs, "dtype": "float64", "max_rel": 0.0, "differs": False}
        for seed in (0, 1, 2)
        for inputs in ("the example inputs", "random inputs")
    ],
    "notes": [],
}
CONFIRMED = {
    "status": "confirmed",
    "configuration": "full",
    "dtype": "float64",
    "seed": 1,
    "inputs": "token ids at every vocabulary shard boundary",
    "seconds": 0.1,
    "outputs": [{"where": "output 0", "max_abs": 3.9, "max_rel": 1.01, "note": "every rank holds it in full"}],
    "at_module": None,
    "failure": "",
}


def finding(witness: dict | None, kind: str = "missing-reduction") -> Discrepancy:
    return Discrepancy(
        kind,
        "the partial sum of down reaches the add without an all-reduce",
        Site("/project/pkg/tp.py", 27, 15, 27, 40, "out = F.linear(h, w)"),
        reference=Site("/project/pkg/model.py", 13, 16),
        reference_node="add",
        ranks=[0, 1],
        suggestion="all-reduce the partial sums",
        witness=witness,
    )


def world(verdict: str, **fields: object) -> WorldSizeResult:
    return WorldSizeResult(2, verdict, **fields)  # type: ignore[arg-type]


def check(*verdicts: str, error: dict | None = None) -> CheckResult:
    return CheckResult("c", [world(v) for v in verdicts], error=error)


@pytest.mark.parametrize(
    ("verdicts", "fail_on", "code"),
    [
        (["verified"], "inconclusive", 0),
        (["discrepancy", "unproven"], "inconclusive", 1),
        (["unproven"], "inconclusive", 3),
        (["unproven", "inconclusive"], "inconclusive", 2),
        (["unproven"], "unproven", 3),
        (["unproven"], "discrepancy", 0),
        (["inconclusive"], "unproven", 0),
        (["inconclusive"], "discrepancy", 0),
        (["discrepancy"], "discrepancy", 1),
        (["error"], "discrepancy", 2),
    ],
)
def test_exit_codes_and_the_fail_on_level(verdicts: list[str], fail_on: str, code: int) -> None:
    assert exit_code([check(*verdicts)], fail_on) == code


def test_a_check_takes_the_most_severe_verdict_of_its_world_sizes() -> None:
    assert check("verified", "unproven").verdict == "unproven"
    assert check("unproven", "inconclusive").verdict == "inconclusive"
    assert check("unproven", "discrepancy", "inconclusive").verdict == "discrepancy"
    assert check("verified", error={"message": "no module"}).verdict == "error"


def test_a_shown_difference_is_numbers_that_differ_or_a_proven_collective_mismatch() -> None:
    assert shown(finding(CONFIRMED))
    assert not shown(finding(AGREE))
    assert not shown(finding({"status": "not-run", "reason": "too large"}))
    assert not shown(finding(None))
    assert shown(finding({"status": "not-run", "reason": "would hang"}, kind="collective-mismatch"))


def test_unproven_findings_travel_through_json() -> None:
    result = world("unproven", unproven=[finding(AGREE)])
    again = WorldSizeResult.from_dict(result.to_dict())
    assert again.verdict == "unproven" and again.unproven[0].witness == AGREE and not again.discrepancies


def tiny_reference() -> Graph:
    meta = TensorMeta((2, 4), "float32")
    return Graph(
        "reference",
        None,
        1,
        [Placeholder("x", "input", "0", meta), Placeholder("b", "parameter", "down.bias", meta)],
        [Node("add", "binary", ("x", "b"), {"fn": "add"}, meta)],
        ["add"],
    )


def test_an_unproven_finding_claims_only_what_is_known_and_keeps_the_suspicion() -> None:
    original = finding(AGREE)
    restated = as_unproven(original, tiny_reference(), None, [0, 1])
    assert restated.message.startswith("not proven: the reference's add (model.py:13:16) has no proven counterpart")
    assert "the numbers agree on 6 trials" in restated.message
    assert "without an all-reduce" not in restated.message  # a guess is not stated as a fact
    assert restated.details["suspected"] == original.message
    assert restated.primary == original.primary and restated.kind == original.kind
    assert "declare" in restated.suggestion and "report the pattern" in restated.suggestion
    no_witness = as_unproven(
        finding({"status": "not-run", "reason": "the model is too large"}), tiny_reference(), None, [0]
    )
    assert "no numeric witness: the model is too large" in no_witness.message


def test_witness_lines_say_how_hard_it_tried() -> None:
    assert trials_summary(AGREE) == ("6 trials (3 seeds of random weights; the example inputs, random inputs; float64)")
    assert headline(AGREE).startswith("no difference found: the outputs agree within 1e-06 (relative) on 6 trials")
    lines = describe(CONFIRMED)
    assert lines[0].startswith("confirmed numerically (full configuration, float64, random weights (seed 1), token ids")
    assert lines[1] == "output 0: max abs error 3.9, relative 1.01 (every rank holds it in full)"
    assert describe({"status": "not-run", "reason": "too large"}) == ["not run: too large"]
    # outputs that agree while the localized module's values differ: reported, not a difference
    inside = {"where": "mlp.down", "max_abs": 0.5, "max_rel": 0.1, "note": "as partial sums over the ranks"}
    assert describe(AGREE | {"at_module": inside | {"differs": True}})[1] == (
        "at module mlp.down the values differ (max abs error 0.5, relative 0.1 (as partial sums over the ranks)), "
        "which the outputs make up for"
    )
    assert len(describe(AGREE | {"at_module": inside | {"differs": False}})) == 1


def test_text_report_marks_each_verdict_and_colours_it_on_request() -> None:
    results = [
        CheckResult("bad", [world("discrepancy", discrepancies=[finding(CONFIRMED)])]),
        CheckResult("gap", [world("unproven", unproven=[as_unproven(finding(AGREE), tiny_reference(), None, [0])])]),
    ]
    plain = text.render(results)
    assert "bad: ✘ discrepancy" in plain and "gap: ⚠ unproven" in plain
    assert "(where the fix belongs)" in plain and "(the first value without a proven relation)" in plain
    assert "suspected: [missing-reduction] the partial sum of down reaches the add" in plain
    assert "witness:   no difference found" in plain and "\033[" not in plain
    coloured = text.render(results, colour=True)
    assert "\033[33m⚠ unproven\033[0m" in coloured and "\033[31m✘ discrepancy\033[0m" in coloured


def test_sarif_levels_error_for_a_discrepancy_and_warning_for_unproven() -> None:
    results = [
        CheckResult(
            "c",
            [world("discrepancy", discrepancies=[finding(CONFIRMED)]), world("unproven", unproven=[finding(AGREE)])],
        )
    ]
    found = sarif.render(results)["runs"][0]["results"]
    assert [(r["ruleId"], r["level"]) for r in found] == [("missing-reduction", "error"), ("unproven", "warning")]
    assert found[1]["properties"] == {"suspected": "missing-reduction", "witness": "agree"}
    rules = {rule["id"] for rule in sarif.render(results)["runs"][0]["tool"]["driver"]["rules"]}
    assert "unproven" in rules
