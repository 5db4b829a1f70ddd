"""Memoization's pieces for scale: the modules beside the blocks traced apart and put back into
a skeleton the ranks share (capture/inline.py), and a template among many ranks proven in halves
of the ranks (verify/partition.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _canonical(graph) -> list[tuple]:
    """A graph's operations with every value named by its position (placeholders by kind and
    target): equal lists are the same program with the same source lines, whatever the names."""
    names = {p.id: f"{p.kind}:{p.target}" for p in graph.placeholders}
    seen = []
    for position, node in enumerate(graph.nodes):
        names[node.id] = f"%{position}"
        # (this file's frames are the test's wrapper of the tracer, called around each trace)
        frames = [(f.file, f.line) for f in node.site.frames if f.file != __file__] if node.site else []
        inputs = tuple(names[i] for i in node.inputs)
        seen.append((node.op, inputs, node.attrs, node.meta, node.module_path, node.collective, frames))
    return [*seen, [names[o] for o in graph.outputs]]


def test_lone_modules_traced_apart_read_as_the_program_traced_whole(monkeypatch: pytest.MonkeyPatch, sandbox) -> None:
    # The ranks' vocabulary-parallel embeddings differ in their bounds, the rest of the skeleton
    # does not: one skeleton is traced for every rank, each rank's embedding on its own, and the
    # skeleton with the embedding, the final norm and the output layer put back is the one a
    # whole trace gives (the same operations, values and source lines).
    from shardproof.capture import blocks, memoized
    from shardproof.capture.program import CheckCapture

    monkeypatch.setenv("SHARDPROOF_JOBS", "1")
    project = load_project(EXAMPLES / "llama")
    stages: list[str] = []
    export = memoized.export_module

    def counting(module, inputs, stage, *rest):
        stages.append(stage)
        return export(module, inputs, stage, *rest)

    monkeypatch.setattr(memoized, "export_module", counting)
    apart = memoized.capture_memoized(CheckCapture(project.check("llama-tp"), project), 4)
    assert sum(s.endswith("(skeleton)") for s in stages) == 2  # the reference's and rank 0's
    assert sum(s.endswith("(module tok_embeddings)") for s in stages) == 5  # each program's own
    assert sum(s.endswith("(module output)") for s in stages) == 2  # equal records on every rank

    monkeypatch.setattr(blocks, "lone_modules", lambda module, found: [])
    stages.clear()
    whole = memoized.capture_memoized(CheckCapture(project.check("llama-tp"), project), 4)
    assert sum(s.endswith("(skeleton)") for s in stages) == 5  # the ranks' records differ
    for one, other in zip([apart.reference, *apart.ranks], [whole.reference, *whole.ranks], strict=True):
        assert _canonical(one.skeleton) == _canonical(other.skeleton)


def _recording_partitions(monkeypatch: pytest.MonkeyPatch, corrupt_finer: bool = False) -> list[tuple[bool, list]]:
    """Halve parts from two ranks on (the example has four), and record each template's cut:
    (finer, the ranks of each part). `corrupt_finer`: the finer cut's obligations are shifted by
    one rank (they cannot be proven)."""
    from shardproof import memoized_run
    from shardproof.verify import partition

    monkeypatch.setattr(memoized_run, "HALVE_FROM", 2)
    monkeypatch.setattr(partition, "HALVE_FROM", 2)
    seen: list[tuple[bool, list]] = []
    original = partition.partition_block

    def recording(*args, finer: bool = False):
        parts = original(*args, finer=finer)
        if finer and corrupt_finer and parts is not None:
            for part in parts:
                part.obligations = [
                    partition.Obligation(o.reference, o.ranks, o.expected[1:] + o.expected[:1])
                    for o in part.obligations
                ]
        seen.append((finer, [[graph.rank for graph, _ in part.ranks] for part in parts or []]))
        return parts

    monkeypatch.setattr(memoized_run, "partition_block", recording)
    return seen


def test_a_template_among_many_ranks_is_proven_in_halves_of_the_ranks(monkeypatch: pytest.MonkeyPatch, sandbox) -> None:
    # The attention's part before its output projection holds no collective: each rank's values
    # there depend on its own inputs only, so half the ranks are proven in one e-graph and half in
    # another (one per saturation child); the parts with collectives hold every rank.
    seen = _recording_partitions(monkeypatch)
    project = load_project(EXAMPLES / "llama")
    (outcome,) = verify_check(project.check("llama-tp"), project, [4], sandbox, numeric_witness=False).results
    assert outcome.verdict == "verified", outcome.summary
    assert [finer for finer, _ in seen] == [True]  # proven at the first, finer cut
    (ranks,) = [cut for _, cut in seen]
    assert [0, 1] in ranks and [2, 3] in ranks and [0, 1, 2, 3] in ranks, ranks


def test_a_finer_cut_whose_obligations_fail_falls_back_to_the_coarser_cut(
    monkeypatch: pytest.MonkeyPatch, sandbox
) -> None:
    # a finer cut states more obligations; where one is not proven, the template is proven as it
    # is cut for fewer ranks, not left to the plain run
    seen = _recording_partitions(monkeypatch, corrupt_finer=True)
    project = load_project(EXAMPLES / "llama")
    (outcome,) = verify_check(project.check("llama-tp"), project, [4], sandbox, numeric_witness=False).results
    assert outcome.verdict == "verified", outcome.summary
    assert [finer for finer, _ in seen] == [True, False]
    assert outcome.stats["templates"] == 1  # still the memoized run
