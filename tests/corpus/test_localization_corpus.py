"""Bug programs with the one line a developer must change (localization/CASES.toml): shardproof
must report each as a discrepancy whose primary site is exactly that line, with its columns.
Each program differs from its reference on a real gloo group as written and agrees once its line
is replaced by the case's fix (localization/GROUND_TRUTH.json, localization/record.py)."""

from __future__ import annotations

import importlib.util
import json
import re
import tempfile
from pathlib import Path

import pytest
from ground_truth import checks, run

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parent / "localization"
_spec = importlib.util.spec_from_file_location("localization_record", CORPUS / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)

CASES = {case["name"]: case for case in record.cases()}
SIZES = {check["name"]: check["world-sizes"] for check in checks(CORPUS)}

# Cases shardproof does not report at their exact line today (name -> where it reports them and
# with what verdict). Each is an xfail(strict): a case that becomes exact fails until it is taken
# off this list, so the list only shrinks.
KNOWN_MISSES: dict[str, str] = {}

_RESULTS: dict[str, object] = {}


def _verified(name: str, sandbox) -> object:
    if name not in _RESULTS:
        project = load_project(CORPUS)
        _RESULTS[name] = verify_check(project.check(name), project, None, sandbox)
    return _RESULTS[name]


def test_every_case_differs_as_written_and_agrees_when_fixed() -> None:
    recorded = json.loads(record.RECORD.read_text())
    assert len(CASES) >= 40
    assert set(CASES) == set(SIZES), "one case per check"
    for name, case in CASES.items():
        text = (CORPUS / case["file"]).read_text()
        assert text.count(case["line"]) == 1, (name, case["line"])
        assert case["fix"].strip() and "\n" not in case["fix"], name
        for world_size in SIZES[name]:
            entry = recorded[name][str(world_size)]
            assert entry["bug"] > record.DIFFERS, (name, world_size, entry)
            assert entry["fixed"] <= record.AGREES, (name, world_size, entry)


def test_every_family_has_three_cases() -> None:
    families: dict[str, int] = {}
    for case in CASES.values():
        families[case["family"]] = families.get(case["family"], 0) + 1
    assert len(families) >= 7 and min(families.values()) >= 3, families


@pytest.mark.parametrize("name", ["vocab-bound-local-block", "plan-k-proj-replicated-output"])
def test_the_recorded_ground_truth_still_holds(name: str) -> None:
    """A sample rerun of the gloo runs, a plain collective program (at two world sizes) and a
    DTensor plan (the whole corpus: `python tests/corpus/localization/record.py`)."""
    (check,) = [c for c in checks(CORPUS) if c["name"] == name]
    for world_size in check["world-sizes"]:
        assert run(check, world_size, CORPUS) > record.DIFFERS
        with tempfile.TemporaryDirectory() as scratch:
            assert run(check, world_size, record.fixed_copy(CASES[name], Path(scratch))) <= record.AGREES


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_MISSES[name], strict=True))
        if name in KNOWN_MISSES
        else name
        for name in CASES
    ],
)
def test_the_discrepancy_is_reported_at_the_line_to_change(name: str, sandbox) -> None:
    case = CASES[name]
    result = _verified(name, sandbox)
    assert result.error is None, result.error
    expected = ((CORPUS / case["file"]).resolve(), record.line_number(case))
    assert [outcome.world_size for outcome in result.results] == SIZES[name]
    for outcome in result.results:
        assert outcome.verdict == "discrepancy", (name, outcome.world_size, outcome.summary)
        primary = outcome.discrepancies[0].primary
        assert primary is not None, (name, outcome.world_size)
        assert (Path(primary.file).resolve(), primary.line) == expected, (name, outcome.world_size, primary)
        assert primary.column is not None and primary.end_column is not None, primary


# (case, world size) -> the number a rank uses and the one the reference computes there
WRONG_CONSTANTS = {
    ("attention-scale-local-width", 2): ("0.353553", "0.5"),  # 1/sqrt(8): a rank's two heads are 8 wide
    ("attention-scale-local-heads", 2): ("0.353553", "0.5"),  # 16 // 2 heads
    ("attention-scale-local-heads", 4): ("0.25", "0.5"),  # 16 // 1 head
    ("norm-divisor-local-width", 2): ("16", "32"),
    ("mean-over-local-length", 2): ("4", "8"),
}


@pytest.mark.parametrize(("name", "world_size"), list(WRONG_CONSTANTS))
def test_a_number_from_the_local_sizes_is_a_wrong_constant(name: str, world_size: int, sandbox) -> None:
    """The rank computes the reference's operation on related values with another number (the
    reference's attention scale, the count its mean divides by): the report names both numbers,
    and real runs differ."""
    used, expected = WRONG_CONSTANTS[(name, world_size)]
    (outcome,) = [o for o in _verified(name, sandbox).results if o.world_size == world_size]
    found = outcome.discrepancies[0]
    assert found.kind == "wrong-constant", (name, outcome.summary)
    assert f"with the number {used} where the reference uses {expected}" in found.message, found.message
    assert (found.found, found.expected.split(",")[0]) == (used, expected)
    assert found.witness is not None and found.witness["status"] == "confirmed", found.witness


_RANGE = re.compile(r"rank (\d+): \[(\d+):(\d+)\]")


@pytest.mark.parametrize("name", list(CASES))
def test_no_message_contradicts_the_ranges_it_prints(name: str, sandbox) -> None:
    """A report that says partial sums do not tile a reduction names why (an overlap, a gap, a rank
    holding none), and the ranges it prints indeed do not tile it."""
    from shardproof.localize.detectors.reduction_coverage import tiling_problem

    result = _verified(name, sandbox)
    for outcome in result.results:
        for finding in [*outcome.discrepancies, *outcome.unproven]:
            text = f"{finding.message} {finding.found}"
            if "do not tile" not in text:
                continue
            held = {int(r): (int(s), int(e)) for r, s, e in _RANGE.findall(finding.found or "")}
            total = re.search(r" of (\d+)\)?$", finding.found or "")
            if "hold no partial sum" in text or not held or total is None:
                continue
            assert tiling_problem(held, int(total.group(1))) is not None, (name, text)
