"""Scale: repeated blocks verified once, and a world size verified in parts cut at its blocks and
saturated at once. Both give the same verdicts and locations as a run that traces every layer and
verifies it whole, and a mistake in one layer of many is still found at its line."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES / "llama"))
import bug_variants  # noqa: E402


def _outcome(result) -> list[tuple]:
    """What a user sees of a world size: its verdict, and the kind and line of each finding."""
    seen = []
    for r in result.results:
        findings = [*r.discrepancies, *r.unproven]  # unproven: the witness is off here
        found = [(d.kind, Path(d.primary.file).name, d.primary.line) for d in findings if d.primary]
        seen.append((r.world_size, r.verdict, found))
    return seen


def test_a_decoder_is_verified_one_block_for_all_its_layers(sandbox) -> None:
    project = load_project(EXAMPLES / "llama")
    result = verify_check(project.check("llama-tp"), project, [2, 4], sandbox)
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")]
    for r in result.results:
        assert r.stats["templates"] == 1 and r.stats["block_instances"] == 2, r.stats
        assert "2 repeated blocks verified as 1 distinct" in r.summary


@pytest.mark.parametrize("check", ["llama-tp", "llama-sp"])
def test_memoized_and_plain_runs_agree_on_the_example(check: str, sandbox) -> None:
    project = load_project(EXAMPLES / "llama")
    memoized = verify_check(project.check(check), project, [2], sandbox, numeric_witness=False)
    plain = verify_check(project.check(check), project, [2], sandbox, numeric_witness=False, memoize=False)
    whole = verify_check(
        project.check(check), project, [2], sandbox, numeric_witness=False, memoize=False, partition=False
    )
    assert _outcome(memoized) == _outcome(plain) == _outcome(whole)
    # every layer traced, verified as five parts at once: before the first block, and the
    # attention and the MLP of each block
    assert plain.results[0].stats["parts"] == 5 and "parts" not in whole.results[0].stats


@pytest.mark.parametrize("name", [v.name for v in bug_variants.VARIANTS])
def test_memoized_and_plain_runs_agree_on_every_bug_variant(name: str, tmp_path: Path, sandbox) -> None:
    bug = next(v for v in bug_variants.VARIANTS if v.name == name)
    project = load_project(bug_variants.materialize(bug, tmp_path / name))
    check = project.checks[0]
    world_size = min(bug.world_sizes)  # where the mistake shows
    memoized = verify_check(check, project, [world_size], sandbox, numeric_witness=False)
    plain = verify_check(check, project, [world_size], sandbox, numeric_witness=False, memoize=False)
    whole = verify_check(check, project, [world_size], sandbox, numeric_witness=False, memoize=False, partition=False)
    assert _outcome(memoized) == _outcome(plain) == _outcome(whole)
    assert memoized.results[0].verdict != "verified", name


ONE_LAYER_WRONG = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, layers=6):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class ParallelBlock(nn.Module):
    def __init__(self, block, index, rank, world_size):
        super().__init__()
        self.index = index
        rows = block.up.weight.shape[0] // world_size
        self.up = nn.Parameter(block.up.weight[rank * rows : (rank + 1) * rows].clone())
        self.down = nn.Parameter(block.down.weight[:, rank * rows : (rank + 1) * rows].clone())

    def forward(self, x):
        partial = F.linear(torch.relu(F.linear(x, self.up)), self.down)
        if self.index != 4:
            dist.all_reduce(partial)
        return x + partial

"""

# Shared by the test models: the parallel model of per-layer blocks and the check's entry points.
_PARALLEL_MODEL_AND_ENTRY_POINTS = """

class ParallelModel(nn.Module):
    def __init__(self, model, rank, world_size):
        super().__init__()
        self.layers = nn.ModuleList(
            ParallelBlock(block, i, rank, world_size) for i, block in enumerate(model.layers)
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build():
    return Model()


def parallelize(model, rank, world_size):
    return ParallelModel(model, rank, world_size)


def inputs():
    return (torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0)),)
"""
ONE_LAYER_WRONG += _PARALLEL_MODEL_AND_ENTRY_POINTS


def _deep_project(root: Path, source: str, world_sizes: str):
    (root / "deep.py").write_text(textwrap.dedent(source))
    (root / "pyproject.toml").write_text(
        '[tool.shardproof]\npython-path = ["."]\n\n[[tool.shardproof.check]]\nname = "deep"\n'
        'reference = "deep:build"\nparallel = "deep:parallelize"\ninputs = "deep:inputs"\n'
        f'world-sizes = {world_sizes}\noutputs = "replicated"\n'
    )
    return load_project(root)


def test_a_mistake_in_one_layer_of_many_is_found_at_its_line(tmp_path: Path, sandbox) -> None:
    # Layer 4 of 6 skips its all-reduce: its recorded computation differs from the others', so
    # it is not covered by their template, and the plain run names the missing reduction.
    project = _deep_project(tmp_path, ONE_LAYER_WRONG, "[2]")
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    line = next(i + 1 for i, text in enumerate(ONE_LAYER_WRONG.splitlines()) if "partial = F.linear" in text)
    assert finding.kind == "missing-reduction"
    assert (Path(finding.primary.file).name, finding.primary.line) == ("deep.py", line), finding.message
    assert "layers.4" in finding.message
    assert finding.witness is not None and finding.witness["status"] == "confirmed"


def test_the_same_model_without_the_mistake_is_verified_one_block_for_six(tmp_path: Path, sandbox) -> None:
    project = _deep_project(tmp_path, ONE_LAYER_WRONG.replace("self.index != 4", "True"), "[2, 4]")
    result = verify_check(project.check("deep"), project, None, sandbox)
    assert [r.verdict for r in result.results] == ["verified", "verified"]
    assert all(r.stats["templates"] == 1 and r.stats["block_instances"] == 6 for r in result.results)


def test_ranks_with_equal_skeleton_records_share_one_traced_skeleton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside its blocks this model does the same on every rank (no rank-dependent number), so
    # one process traces the skeleton once for all its ranks; the graphs are those traced per rank.
    from shardproof.capture import blocks, memoized
    from shardproof.capture.program import CheckCapture

    project = _deep_project(tmp_path, ONE_LAYER_WRONG.replace("self.index != 4", "True"), "[4]")
    monkeypatch.setenv("SHARDPROOF_JOBS", "1")
    traced_skeletons: list[str] = []
    export = memoized.export_module

    def counting(module, inputs, stage, *rest):
        if stage.endswith("(skeleton)"):
            traced_skeletons.append(stage)
        return export(module, inputs, stage, *rest)

    monkeypatch.setattr(memoized, "export_module", counting)

    def graphs() -> list:
        ranks = memoized.capture_memoized(CheckCapture(project.check("deep"), project), 4).ranks
        return [
            (
                p.skeleton.name,
                p.skeleton.rank,
                [(n.id, n.op, n.inputs, n.attrs, n.meta, n.collective) for n in p.skeleton.nodes],
            )
            for p in ranks
        ]

    shared = graphs()
    assert len(traced_skeletons) == 2  # the reference's and rank 0's
    record_program = blocks.record_program
    monkeypatch.setattr(blocks, "record_program", lambda *a: blocks.ProgramRecord(record_program(*a).instances, None))
    traced_skeletons.clear()
    assert graphs() == shared
    assert len(traced_skeletons) == 5  # the reference's and every rank's


def test_a_warm_run_reuses_every_unit_and_an_edit_only_the_units_it_leaves_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox
) -> None:
    import shutil

    monkeypatch.setenv("SHARDPROOF_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "llama"
    shutil.copytree(EXAMPLES / "llama", root, ignore=shutil.ignore_patterns("__pycache__"))

    def run() -> dict:
        project = load_project(root)
        (outcome,) = verify_check(project.check("llama-tp"), project, [2], sandbox).results
        assert outcome.verdict == "verified", outcome.summary
        return outcome.stats

    cold, warm = run(), run()
    # the block template, in two parts (its attention and its MLP), and the skeleton
    assert (cold["units"], cold["cached_units"]) == (3, 0)
    assert warm["cached_units"] == 3
    # A smaller vocabulary changes the embedding and the LM head, not the blocks: only the
    # skeleton is saturated again.
    model = root / "llama_example" / "model.py"
    model.write_text(model.read_text().replace("vocab_size: int = 512", "vocab_size: int = 384"))
    edited = run()
    assert edited["cached_units"] == 2


def test_the_command_line_reuses_a_result_until_a_file_it_read_changes(tmp_path: Path) -> None:
    import json
    import os
    import shutil
    import subprocess

    root = tmp_path / "llama"
    shutil.copytree(EXAMPLES / "llama", root, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, SHARDPROOF_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "shardproof", "verify", "--project", str(root), "--check", "llama-tp"]
    command += ["--world-size", "2", "--json"]

    def run() -> dict:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=600)
        (outcome,) = json.loads(done.stdout)["checks"][0]["world_sizes"]
        assert outcome["verdict"] == "verified", outcome
        return outcome["stats"]

    assert not run().get("reused")
    assert run().get("reused") is True
    # any edit of a file the check read (here a comment in the parallel code) is a new result
    parallel = root / "llama_example" / "tp.py"
    parallel.write_text(parallel.read_text() + "\n# edited\n")
    assert not run().get("reused")


def test_the_command_line_never_reuses_a_result_after_a_variable_the_model_read_changed(tmp_path: Path) -> None:
    """A model configured from the environment: the same files give another model."""
    import json
    import os
    import subprocess

    (tmp_path / "env_model.py").write_text(
        textwrap.dedent("""
        import os

        from llama_example.model import Llama, LlamaConfig, example_inputs

        CONFIG = LlamaConfig(n_layers=int(os.environ["ENV_MODEL_LAYERS"]), dim=64, ffn_dim=128, vocab_size=256)


        def build():
            return Llama(CONFIG)


        def inputs():
            return example_inputs(CONFIG)
        """)
    )
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [tool.shardproof]
        python-path = [".", "{(EXAMPLES / "llama").as_posix()}"]

        [[tool.shardproof.check]]
        name = "env"
        reference = "env_model:build"
        parallel = "llama_example.tp:parallelize"
        inputs = "env_model:inputs"
        world-sizes = [2]
        outputs = "replicated"
        """)
    )
    command = [sys.executable, "-m", "shardproof", "verify", "--project", str(tmp_path), "--json"]

    def run(**variables: str) -> dict:
        env = dict(os.environ, SHARDPROOF_CACHE_DIR=str(tmp_path / "cache"), **variables)
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=600)
        (outcome,) = json.loads(done.stdout)["checks"][0]["world_sizes"]
        assert outcome["verdict"] == "verified", outcome
        return outcome["stats"]

    assert run(ENV_MODEL_LAYERS="2")["block_instances"] == 2
    assert run(ENV_MODEL_LAYERS="2").get("reused") is True
    changed = run(ENV_MODEL_LAYERS="3")
    assert not changed.get("reused") and changed["block_instances"] == 3
    # a variable the model never read does not matter
    assert run(ENV_MODEL_LAYERS="3", UNRELATED_SETTING="x").get("reused") is True


PER_LAYER_SCALE = (
    """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, index, dim=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.register_buffer("scale", torch.full((dim,), float(index + 1)), persistent=False)

    def forward(self, x):
        return x + self.proj(x) * self.scale


class Model(nn.Module):
    def __init__(self, layers=4):
        super().__init__()
        self.layers = nn.ModuleList(Block(i) for i in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class ParallelBlock(nn.Module):
    def __init__(self, block, index, rank, world_size, dim=16):
        super().__init__()
        columns = dim // world_size
        self.proj = nn.Parameter(block.proj.weight[:, rank * columns : (rank + 1) * columns].clone())
        self.rank, self.columns = rank, columns
        self.register_buffer("scale", torch.full((dim,), 1.0), persistent=False)

    def forward(self, x):
        local = x[..., self.rank * self.columns : (self.rank + 1) * self.columns]
        partial = F.linear(local, self.proj)
        dist.all_reduce(partial)
        return x + partial * self.scale

"""
    + _PARALLEL_MODEL_AND_ENTRY_POINTS
)


def test_a_template_never_stands_for_a_layer_whose_reference_values_differ(tmp_path: Path, sandbox) -> None:
    # Every reference layer scales by its own constant; the parallel layers all by 1. Layer 0
    # (the template) agrees, so only a check of the reference's values per layer keeps the
    # template from vouching for the others.
    project = _deep_project(tmp_path, PER_LAYER_SCALE, "[2]")
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict != "verified", outcome.summary


PARTIAL_UPDATE_CROSSES_BLOCKS = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, update=None):
        if update is not None:
            x = x + update
        return x, self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        update = None
        for layer in self.layers:
            x, update = layer(x, update)
        return x + update


class ParallelBlock(nn.Module):
    def __init__(self, block, rank, world_size):
        super().__init__()
        rows = block.up.weight.shape[0] // world_size
        self.up = nn.Parameter(block.up.weight[rank * rows : (rank + 1) * rows].clone())
        self.down = nn.Parameter(block.down.weight[:, rank * rows : (rank + 1) * rows].clone())

    def forward(self, x, partial_update=None):
        if partial_update is not None:
            dist.all_reduce(partial_update)
            x = x + partial_update
        return x, F.linear(torch.relu(F.linear(x, self.up)), self.down)


class ParallelModel(nn.Module):
    def __init__(self, model, rank, world_size):
        super().__init__()
        self.layers = nn.ModuleList(ParallelBlock(block, rank, world_size) for block in model.layers)

    def forward(self, x):
        update = None
        for layer in self.layers:
            x, update = layer(x, update)
        dist.all_reduce(update)
        return x + update


def build():
    return Model()


def parallelize(model, rank, world_size):
    return ParallelModel(model, rank, world_size)


def inputs():
    return (torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0)),)
"""


def test_a_partial_sum_crossing_a_block_boundary_is_verified_whole(tmp_path: Path, sandbox) -> None:
    # Each block reduces the previous block's update when it adds it, so the update leaves a block
    # as partial sums. A part assumes only whole values or blocks of them at its inputs, so the
    # part computing the update cannot prove what the next part assumed: the world size is
    # verified whole instead, with the same verdict a plain run gives.
    project = _deep_project(tmp_path, PARTIAL_UPDATE_CROSSES_BLOCKS, "[2]")
    check = project.check("deep")
    (parts,) = verify_check(check, project, [2], sandbox, numeric_witness=False, memoize=False).results
    (whole,) = verify_check(check, project, [2], sandbox, numeric_witness=False, memoize=False, partition=False).results
    assert parts.verdict == whole.verdict == "verified", parts.summary
    assert "verification in parts" in parts.seconds and "parts" not in parts.stats


@pytest.mark.parametrize("memoized", [False, True])
def test_ranks_captured_in_parallel_are_those_captured_one_after_another(
    memoized: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardproof.capture.memoized import capture_memoized
    from shardproof.capture.program import CheckCapture

    project = load_project(EXAMPLES / "llama")
    check = project.check("llama-sp" if not memoized else "llama-tp")

    reported: list[str] = []

    def graphs(jobs: str) -> list:
        monkeypatch.setenv("SHARDPROOF_JOBS", jobs)
        capture = CheckCapture(check, project, progress=reported.append)
        if memoized:
            pieces = capture_memoized(capture, 4).ranks
            programs = [(p.skeleton, p.values) for p in pieces] + [
                (graph, p.values) for p in pieces for graph in p.templates.values()
            ]
        else:
            programs = [(r.graph, r.values) for r in capture.capture(4).ranks]
        return [
            (graph.name, [(n.id, n.op, n.inputs, n.attrs, n.meta, n.site, n.collective) for n in graph.nodes], values)
            for graph, values in programs
        ]

    assert graphs("2") == graphs("1")
    # with two processes, this one captured rank 0 and whichever others it took first, the other
    # process the rest; one process captured every rank in order
    ranks_here = [int(m.split(" of ")[0].split()[-1]) for m in reported if m.startswith("capturing rank")]
    in_two, in_one = ranks_here[: len(ranks_here) - 4], ranks_here[len(ranks_here) - 4 :]
    assert in_one == [0, 1, 2, 3]
    assert in_two[0] == 0 and len(in_two) < 4 and len(set(in_two)) == len(in_two)


def test_ranks_given_the_reference_built_once_are_those_that_build_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each rank captured in a fork of its own from the reference built once (as for a large model)
    # gives the graphs and relations of ranks that each build the reference in their own world.
    from shardproof.capture import memoized
    from shardproof.capture.program import CheckCapture

    project = load_project(EXAMPLES / "llama")
    check = project.check("llama-tp")

    def graphs(shared: bool) -> list:
        monkeypatch.setattr(memoized, "_WORTH_A_FORK", 0.0 if shared else float("inf"))
        capture = CheckCapture(check, project)
        pieces = capture_memoized_checked(capture, shared)
        programs = [(p.skeleton, p.values) for p in pieces] + [
            (graph, p.values) for p in pieces for graph in p.templates.values()
        ]
        return [
            (graph.name, [(n.id, n.op, n.inputs, n.attrs, n.meta, n.site, n.collective) for n in graph.nodes], values)
            for graph, values in programs
        ]

    def capture_memoized_checked(capture, shared: bool) -> list:
        from shardproof.capture import forked

        isolated: list[bool] = []
        original = forked._in_fork
        monkeypatch.setattr(forked, "_in_fork", lambda fn, rank: (isolated.append(True), original(fn, rank))[1])
        ranks = memoized.capture_memoized(capture, 4).ranks
        assert bool(isolated) == shared  # the forks were (not) used
        return ranks

    assert graphs(shared=True) == graphs(shared=False)


def test_a_layer_reducing_with_max_among_layers_reducing_with_sum_is_not_verified(tmp_path: Path, sandbox) -> None:
    # The layers differ only in the reduction their all-reduce applies: the record must tell the
    # reductions apart, or the first layer's template would vouch for the MAX layer.
    source = ONE_LAYER_WRONG.replace(
        "        if self.index != 4:\n            dist.all_reduce(partial)",
        "        dist.all_reduce(partial, op=dist.ReduceOp.MAX if self.index == 4 else dist.ReduceOp.SUM)",
    )
    assert "ReduceOp.MAX" in source
    project = _deep_project(tmp_path, source, "[2]")
    (outcome,) = verify_check(project.check("deep"), project, [2], sandbox, numeric_witness=False).results
    assert outcome.verdict != "verified", outcome.summary


def test_a_layer_the_ranks_compute_another_way_is_a_template_of_its_own(tmp_path: Path, sandbox) -> None:
    # the ranks' layer 4 spells its down projection as a matmul with the transposed weight (right,
    # and recorded apart from the other layers, which the reference records alike): two templates
    source = ONE_LAYER_WRONG.replace(
        "        if self.index != 4:\n            dist.all_reduce(partial)\n",
        "        if self.index == 4:\n            partial = torch.relu(F.linear(x, self.up)) @ self.down.t()\n"
        "        dist.all_reduce(partial)\n",
    )
    assert source != ONE_LAYER_WRONG
    project = _deep_project(tmp_path, source, "[2, 4]")
    result = verify_check(project.check("deep"), project, None, sandbox)
    assert [r.verdict for r in result.results] == ["verified", "verified"], [r.summary for r in result.results]
    assert all(r.stats["templates"] == 2 and r.stats["block_instances"] == 6 for r in result.results)
