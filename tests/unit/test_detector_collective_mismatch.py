"""collective-mismatch: ranks of one group whose collective calls cannot pair up (the encoder's
collective issue) are reported at the first rank's call, the other ranks' calls related."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, Kit, at

from shardproof.localize.detectors.collective_mismatch import collective_mismatch
from shardproof.localize.diagnose import PROGRAM_DETECTORS
from shardproof.verify.encode import CollectiveIssue

MESSAGE = "rank 0's collective 0 is an all-reduce where rank 1's is an all-gather"


def _kit(issues: list[CollectiveIssue]) -> Kit:
    """Rank 0 all-reduces its value at line 40 where rank 1 all-gathers it at line 41."""
    kit = Kit()
    kit.input("x", 2, 8, 16)
    kit.ref.op("y", "unary", "x", out=(2, 8, 16), line=10, fn="relu")
    kit.ranks[0].all_reduce("c", "x", out=(2, 8, 16), line=40)
    kit.ranks[1].op("c", "all_gather", "x", out=(4, 8, 16), line=41)
    for program in kit.programs:
        program.output(program.graph.nodes[-1].id)
    kit.evidence["issues"] = issues
    return kit


def _issue(*nodes: tuple[str, str]) -> CollectiveIssue:
    return CollectiveIssue(group=(0, 1), index=0, message=MESSAGE, nodes=list(nodes))


def test_the_first_ranks_call_is_reported_with_the_others_related() -> None:
    issue = _issue(("rank0", "c"), ("rank1", "c"))
    found = collective_mismatch(_kit([issue]).context(), issue)
    assert found.kind == "collective-mismatch"
    assert at(found) == (PARALLEL_FILE, 40)
    assert [(s.line, s.note) for s in found.related] == [(41, "rank 1: all_gather")]
    assert found.message == MESSAGE and found.ranks == [0, 1]
    assert found.parallel_nodes == ["rank0/c", "rank1/c"]
    picture = found.details["neighbourhood"]
    assert picture["titles"] == ["rank 0", "rank 1"]


def test_a_rank_that_makes_no_call_is_shown_as_missing() -> None:
    issue = _issue(("rank0", "c"))
    found = collective_mismatch(_kit([issue]).context(), issue)
    assert at(found) == (PARALLEL_FILE, 40) and found.related == []
    picture = found.details["neighbourhood"]
    assert picture["titles"] == ["rank 0", "other ranks"]
    assert picture["parallel"][0]["missing"] is True


def test_no_collective_issue_is_no_finding() -> None:
    (detector,) = [d for d in PROGRAM_DETECTORS if d.name == "collective-mismatch"]
    assert detector.find(_kit([]).context(), [0]) is None
    issue = _issue(("rank0", "c"), ("rank1", "c"))
    found = detector.find(_kit([issue]).context(), [0])
    assert found is not None and found.kind == "collective-mismatch"
