"""Pipeline parallelism (examples/pipeline): stages on ranks with send/recv between them. The
composition of the stages is verified against the reference; a boundary that drops the residual
stream, a missing stage and a send to the wrong rank are found."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check
from shardproof.witness.run import compare_numerically

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"
STAGES = "pp_example/pp.py"


def _variant(tmp_path: Path, original: str, buggy: str) -> tuple[Path, int]:
    """The example with one line of the stages changed, and that line's number."""
    root = shutil.copytree(EXAMPLE, tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    source = root / STAGES
    lines = source.read_text().splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line.strip() == original]
    lines[index] = lines[index].replace(original, buggy)
    source.write_text("".join(lines))
    return root, index + 1


def test_the_stages_compose_to_the_reference_at_2_and_4_ranks(sandbox) -> None:
    project = load_project(EXAMPLE)
    result = verify_check(project.check("pipeline"), project, [2, 4], sandbox)
    assert result.error is None
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")]
    for r in result.results:
        (output,) = r.outputs
        assert output.relation == "replicated"
        assert output.description == f"the last rank (rank {r.world_size - 1}) returns the full reference output"
        # the stages run with real numbers too (sends and receives between rank threads)
        numbers = compare_numerically(project.check("pipeline"), project, r.world_size)
        assert not numbers.differs, numbers.to_dict()


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_boundary_that_drops_the_residual_is_reported_at_the_send(tmp_path: Path, world_size: int, sandbox) -> None:
    root, line = _variant(
        tmp_path, "dist.send(hidden + residual, dst=self.rank + 1)", "dist.send(hidden, dst=self.rank + 1)"
    )
    project = load_project(root)
    (outcome,) = verify_check(project.checks[0], project, [world_size], sandbox).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "wrong-handover", finding.message
    assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness
    assert finding.primary is not None and finding.primary.file.endswith(STAGES)
    assert finding.primary.line == line
    assert "drops" in finding.message and finding.ranks == [0]


def test_a_split_that_leaves_layers_to_no_rank_is_reported_at_the_stage_length(tmp_path: Path, sandbox) -> None:
    # every stage gets one layer of four at two ranks: layers 2 and 3 run nowhere
    root, line = _variant(
        tmp_path,
        "per_stage = len(reference.layers) // world_size",
        "per_stage = len(reference.layers) // (world_size + 1)",
    )
    project = load_project(root)
    (outcome,) = verify_check(project.checks[0], project, [2], sandbox).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "missing-layers", finding.message
    assert "no rank runs layers.2-3 of the reference's 4 layers" in finding.message
    assert "too short (1 each, 2 of 4 in all)" in finding.message
    assert finding.primary is not None and finding.primary.file.endswith(STAGES)
    assert finding.primary.line == line
    assert [(s.line, s.note) for s in finding.related] == [(line + 2, "selects each stage's layers")]
    assert finding.found == "rank 0 runs layers.0; rank 1 runs layers.1"
    assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness


def test_stage_blocks_that_overlap_are_reported_at_the_stage_start(tmp_path: Path, sandbox) -> None:
    # `start = rank`: at two ranks the stages run layers 0-1 and 1-2, and layer 3 runs nowhere;
    # at four ranks (one layer each) the same line is right
    root, line = _variant(tmp_path, "start = rank * per_stage", "start = rank")
    project = load_project(root)
    two, four = verify_check(project.checks[0], project, [2, 4], sandbox).results
    assert four.verdict == "verified"
    assert two.verdict == "discrepancy"
    finding = two.discrepancies[0]
    assert finding.kind == "missing-layers", finding.message
    assert "no rank runs layers.3" in finding.message
    assert "do not start where the previous stage's block ends" in finding.message
    assert finding.found == "rank 0 runs layers.0-1; rank 1 runs layers.1-2"
    assert finding.primary is not None and finding.primary.file.endswith(STAGES)
    assert finding.primary.line == line


def test_a_send_to_the_wrong_rank_is_a_hang(tmp_path: Path, sandbox) -> None:
    root, _ = _variant(
        tmp_path, "dist.send(hidden + residual, dst=self.rank + 1)", "dist.send(hidden + residual, dst=self.rank + 2)"
    )
    project = load_project(root)
    (outcome,) = verify_check(project.checks[0], project, [4], sandbox, numeric_witness=False).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "collective-mismatch", finding.message
    assert "hang" in finding.message


def test_batched_point_to_point_calls_are_verified_and_run(tmp_path: Path, sandbox) -> None:
    root, _ = _variant(
        tmp_path,
        "dist.send(hidden + residual, dst=self.rank + 1)",
        "dist.batch_isend_irecv([dist.P2POp(dist.isend, hidden + residual, self.rank + 1)])",
    )
    source = root / STAGES
    source.write_text(
        source.read_text().replace(
            "dist.recv(hidden, src=self.rank - 1)",
            "dist.batch_isend_irecv([dist.P2POp(dist.irecv, hidden, self.rank - 1)])[0].wait()",
        )
    )
    project = load_project(root)
    result = verify_check(project.checks[0], project, [2, 4], sandbox)
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")]
    numbers = compare_numerically(project.checks[0], project, 4)
    assert not numbers.differs, numbers.to_dict()


_EXCHANGE = '''
import torch
import torch.distributed as dist
from torch import nn


class Projection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x)


def build():
    return Projection()


def example_inputs():
    return (torch.randn(4, 8),)


class Exchange(nn.Module):
    """Each of two ranks projects its half of the rows and swaps halves with the other."""

    def __init__(self, reference, rank, world_size):
        super().__init__()
        self.proj, self.rank = reference.proj, rank

    def forward(self, x):
        peer = 1 - self.rank
        mine = self.proj(x.chunk(2)[self.rank])
        theirs = torch.empty_like(mine)
        CALLS
        return torch.cat([mine, theirs] if self.rank == 0 else [theirs, mine])


def parallelize(reference, rank, world_size):
    return Exchange(reference, rank, world_size)
'''

_BATCHED = (
    "ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]\n"
    "        for work in dist.batch_isend_irecv(ops if ORDER else ops[::-1]):\n"
    "            work.wait()"
)


def _exchange_project(tmp_path: Path, calls: str) -> Path:
    root = tmp_path / "exchange"
    root.mkdir()
    (root / "exchange.py").write_text(_EXCHANGE.replace("CALLS", calls))
    (root / "pyproject.toml").write_text(
        '[project]\nname = "exchange"\nversion = "0"\n\n[tool.shardproof]\npython-path = ["."]\n\n'
        '[[tool.shardproof.check]]\nname = "swap"\nreference = "exchange:build"\n'
        'parallel = "exchange:parallelize"\ninputs = "exchange:example_inputs"\nworld-sizes = [2]\n'
    )
    return root


@pytest.mark.parametrize("order", ["True", "self.rank == 0"])
def test_two_ranks_that_send_to_each_other_in_one_batch_pair_up_in_any_order(
    tmp_path: Path, order: str, sandbox
) -> None:
    # both ranks list their send first, or rank 1 its receive first: the calls of a batch run at once
    project = load_project(_exchange_project(tmp_path, _BATCHED.replace("ORDER", order)))
    (outcome,) = verify_check(project.checks[0], project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict == "verified", outcome.summary
    assert not compare_numerically(project.checks[0], project, 2).differs


def test_two_ranks_that_both_send_first_with_blocking_calls_hang(tmp_path: Path, sandbox) -> None:
    blocking = "dist.send(mine, dst=peer)\n        dist.recv(theirs, src=peer)"
    project = load_project(_exchange_project(tmp_path, blocking))
    (outcome,) = verify_check(project.checks[0], project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "collective-mismatch" and "both send" in finding.message and "hang" in finding.message


def test_two_ranks_that_both_send_first_without_blocking_pair_up(tmp_path: Path, sandbox) -> None:
    # isend then irecv on both ranks: neither call waits, so the k-th value each rank sends is the
    # k-th the other receives (matched per direction, not in each rank's order of calls)
    nonblocking = (
        "works = [dist.isend(mine, dst=peer), dist.irecv(theirs, src=peer)]\n"
        "        for work in works:\n"
        "            work.wait()"
    )
    project = load_project(_exchange_project(tmp_path, nonblocking))
    (outcome,) = verify_check(project.checks[0], project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict == "verified", outcome.summary
    assert not compare_numerically(project.checks[0], project, 2).differs


def test_a_blocking_receive_first_on_one_rank_pairs_with_the_others_send(tmp_path: Path, sandbox) -> None:
    ordered = (
        "if self.rank == 0:\n"
        "            dist.send(mine, dst=peer)\n"
        "            dist.recv(theirs, src=peer)\n"
        "        else:\n"
        "            dist.recv(theirs, src=peer)\n"
        "            dist.send(mine, dst=peer)"
    )
    project = load_project(_exchange_project(tmp_path, ordered))
    (outcome,) = verify_check(project.checks[0], project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict == "verified", outcome.summary


def test_a_gather_list_on_a_rank_that_is_not_the_destination_is_reported_at_the_call(tmp_path: Path, sandbox) -> None:
    # torch refuses a gather_list on any rank but dst: the call fails on rank 1
    everywhere = (
        "pieces = [torch.empty_like(mine) for _ in range(2)]\n"
        "        dist.gather(mine, pieces, dst=0)\n"
        "        theirs = pieces[1 - self.rank]"
    )
    project = load_project(_exchange_project(tmp_path, everywhere))
    (outcome,) = verify_check(project.checks[0], project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "collective-mismatch" and "not the destination" in finding.message
    assert finding.primary is not None and finding.primary.file.endswith("exchange.py")
    assert "dist.gather" in (finding.primary.code or "")
    assert "destination rank only" in finding.suggestion


_RING = '''
import torch
import torch.distributed as dist
from torch import nn

from exchange import build  # noqa: F401


def example_inputs():
    return (torch.randn(6, 8),)  # two rows per rank


class RingGather(nn.Module):
    """Each rank projects its block of rows and passes blocks around the ring of ranks, one step
    at a time: after world size - 1 steps every rank holds every block."""

    def __init__(self, reference, rank, world_size):
        super().__init__()
        self.proj, self.rank, self.world_size = reference.proj, rank, world_size

    def forward(self, x):
        rank, ws = self.rank, self.world_size
        blocks = [None] * ws
        blocks[rank] = outgoing = self.proj(x.chunk(ws)[rank])
        for step in range(ws - 1):
            incoming = torch.empty_like(outgoing)
            CALLS
            blocks[(rank - step - 1) % ws] = outgoing = incoming
        return torch.cat(blocks)


def parallelize(reference, rank, world_size):
    return RingGather(reference, rank, world_size)
'''


def _ring_project(tmp_path: Path, calls: str) -> Path:
    root = _exchange_project(tmp_path, "pass")
    (root / "ring.py").write_text(_RING.replace("CALLS", calls))
    text = (root / "pyproject.toml").read_text().replace('"exchange:parallelize"', '"ring:parallelize"')
    text = text.replace('"exchange:example_inputs"', '"ring:example_inputs"')
    (root / "pyproject.toml").write_text(text.replace("world-sizes = [2]", "world-sizes = [3]"))
    return root


_SEND, _RECV = "dist.send(outgoing, dst=(rank + 1) % ws)", "dist.recv(incoming, src=(rank - 1) % ws)"


def test_a_ring_in_which_every_rank_sends_first_with_blocking_calls_hangs(tmp_path: Path, sandbox) -> None:
    # measured on gloo: three ranks that each send to the next before receiving hang, even for 4 elements
    project = load_project(_ring_project(tmp_path, f"{_SEND}\n            {_RECV}"))
    (outcome,) = verify_check(project.checks[0], project, [3], sandbox, numeric_witness=False).results
    assert outcome.verdict == "discrepancy"
    finding = outcome.discrepancies[0]
    assert finding.kind == "collective-mismatch" and "cycle of blocking calls" in finding.message, finding.message
    assert "rank 0 in a send to rank 1, rank 1 in a send to rank 2, rank 2 in a send to rank 0" in finding.message
    assert finding.primary is not None and finding.primary.file.endswith("ring.py")
    assert "dist.send" in (finding.primary.code or "")


def test_a_ring_whose_odd_ranks_receive_first_is_verified(tmp_path: Path, sandbox) -> None:
    calls = (
        f"if rank % 2 == 0:\n                {_SEND}\n                {_RECV}\n"
        f"            else:\n                {_RECV}\n                {_SEND}"
    )
    project = load_project(_ring_project(tmp_path, calls))
    (outcome,) = verify_check(project.checks[0], project, [3], sandbox, numeric_witness=False).results
    assert outcome.verdict == "verified", outcome.summary
