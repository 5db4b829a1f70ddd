"""A rank that reduces its partial sum another way: scaled before the all-reduce and back after
(divided by the world size, in place or not, or times a constant), averaged by the collective and
scaled back, summed in float64 and cast back, flattened into one buffer with another value and
viewed back (a coalesced all-reduce): the same function, verified; a scaling not undone is
a discrepancy at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_memoization import ONE_LAYER_WRONG, _deep_project

from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

_REDUCE = "        if self.index != 4:\n            dist.all_reduce(partial)\n"
SCALED = {
    "times two, halved after": "        partial = partial * 2\n        dist.all_reduce(partial)\n"
    "        partial = partial / 2\n",
    "averaged, times the world size after": "        partial = partial / dist.get_world_size()\n"
    "        dist.all_reduce(partial)\n        partial = partial * dist.get_world_size()\n",
    "times a half, doubled after": "        partial = partial * 0.5\n        dist.all_reduce(partial)\n"
    "        partial = partial * 2.0\n",
    "divided in place, multiplied back in place": "        partial.div_(dist.get_world_size())\n"
    "        dist.all_reduce(partial)\n        partial.mul_(dist.get_world_size())\n",
    "averaged by the collective, times the world size after": "        dist.all_reduce(partial, op=dist.ReduceOp.AVG)\n"
    "        partial = partial * dist.get_world_size()\n",
    "flattened into one buffer with another value, viewed back": "        twin = partial * 3\n"
    "        buffer = torch.cat([partial.flatten(), twin.flatten()])\n        dist.all_reduce(buffer)\n"
    "        partial = buffer[: partial.numel()].view_as(partial)\n",
    "times one before the all-reduce": "        partial = partial * 1\n        dist.all_reduce(partial)\n",
    "summed in float64, cast back": "        partial = partial.double()\n        dist.all_reduce(partial)\n"
    "        partial = partial.float()\n",
}


@pytest.mark.parametrize("name", sorted(SCALED))
def test_a_partial_sum_reduced_another_way_is_verified(name: str, tmp_path: Path, sandbox) -> None:
    source = ONE_LAYER_WRONG.replace(_REDUCE, SCALED[name])
    assert source != ONE_LAYER_WRONG
    project = _deep_project(tmp_path, source, "[2, 4]")
    result = verify_check(project.check("deep"), project, None, sandbox)
    assert [r.verdict for r in result.results] == ["verified", "verified"], [r.summary for r in result.results]


def test_a_scaling_not_undone_is_a_discrepancy_at_its_line(tmp_path: Path, sandbox) -> None:
    source = ONE_LAYER_WRONG.replace(_REDUCE, "        partial = partial * 2\n        dist.all_reduce(partial)\n")
    project = _deep_project(tmp_path, source, "[2]")
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    (finding,) = outcome.discrepancies
    line = next(i + 1 for i, text in enumerate(source.splitlines()) if "partial = partial * 2" in text)
    assert (Path(finding.primary.file).name, finding.primary.line) == ("deep.py", line), finding.message
