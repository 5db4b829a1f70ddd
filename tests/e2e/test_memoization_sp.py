"""Sequence-parallel blocks verified once for all their layers (verify/block_contracts.py): a
template is proven with each rank's inputs assumed to be its block of the sequence, and stands for
a layer only where the skeleton proves that layer's inputs are exactly that. A layer fed another
block, a layer whose output is not the block the next one assumes, a layer missing its
reduce-scatter are never verified through the templates; the plain run gives the verdict."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shardproof.config import load_project
from shardproof.pipeline import verify_check, verify_memoized

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# A residual MLP decoder with Megatron-style sequence parallelism: between the layers every rank
# holds its block of the sequence; each layer gathers the sequence, runs its column- and
# row-parallel projections and reduce-scatters the partial sums back to sequence blocks.
SEQUENCE_PARALLEL = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

LAYERS = 8


class Block(nn.Module):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def gather(x):
    world = dist.get_world_size()
    out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous())
    return torch.cat(out.chunk(world, dim=0), dim=1)


def reduce_scatter(x):
    world = dist.get_world_size()
    by_rank = torch.cat(x.chunk(world, dim=1), dim=0).contiguous()
    out = torch.empty((x.shape[0], x.shape[1] // world, x.shape[2]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, by_rank)
    return out


def own_block(x, shift=0):
    world, rank = dist.get_world_size(), dist.get_rank()
    size = x.shape[1] // world
    start = ((rank + shift) % world) * size
    return x[:, start : start + size].contiguous()  # (a layer fed a view would record its copy)


class ParallelBlock(nn.Module):
    def __init__(self, block, index, rank, world_size):
        super().__init__()
        self.index = index
        rows = block.up.weight.shape[0] // world_size
        self.up = nn.Parameter(block.up.weight[rank * rows : (rank + 1) * rows].clone())
        self.down = nn.Parameter(block.down.weight[:, rank * rows : (rank + 1) * rows].clone())

    def forward(self, x):
        partial = F.linear(torch.relu(F.linear(gather(x), self.up)), self.down)
        return x + reduce_scatter(partial)


class ParallelModel(nn.Module):
    def __init__(self, model, rank, world_size):
        super().__init__()
        self.layers = nn.ModuleList(
            ParallelBlock(block, i, rank, world_size) for i, block in enumerate(model.layers)
        )

    def forward(self, x):
        x = own_block(x)
        for i, layer in enumerate(self.layers):
            x = layer(x)
        return gather(x)


def build():
    return Model()


def parallelize(model, rank, world_size):
    return ParallelModel(model, rank, world_size)


def inputs():
    return (torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)),)
"""

# The loop of the parallel model and the return of its block, as SEQUENCE_PARALLEL writes them
LOOP = "        for i, layer in enumerate(self.layers):\n"
BLOCK_RETURN = "        return x + reduce_scatter(partial)\n"


def _project(root: Path, source: str):
    root.mkdir(parents=True, exist_ok=True)
    (root / "spdeep.py").write_text(textwrap.dedent(source))
    (root / "pyproject.toml").write_text(
        '[tool.shardproof]\npython-path = ["."]\n\n[[tool.shardproof.check]]\nname = "sp"\n'
        'reference = "spdeep:build"\nparallel = "spdeep:parallelize"\ninputs = "spdeep:inputs"\n'
        'world-sizes = [2]\noutputs = "replicated"\n'
    )
    return load_project(root)


def _variant(old: str, new: str) -> str:
    assert old in SEQUENCE_PARALLEL, old
    return SEQUENCE_PARALLEL.replace(old, new)


def _verdicts(source: str, root: Path, sandbox, world_size: int = 4):
    """The memoized attempt's result (None: not proven through the templates), a run's result,
    and the result of a run that traces every layer."""
    from shardproof.capture.program import CheckCapture

    project = _project(root, source)
    check = project.check("sp")
    capture = CheckCapture(check, project, progress=lambda _: None)
    memoized = verify_memoized(capture, check, world_size, sandbox, lambda *_: None)
    (full,) = verify_check(check, project, [world_size], sandbox, numeric_witness=False).results
    (plain,) = verify_check(check, project, [world_size], sandbox, numeric_witness=False, memoize=False).results
    return memoized, full, plain


def test_a_sequence_parallel_decoder_is_verified_one_block_for_all_its_layers(tmp_path: Path, sandbox) -> None:
    memoized, full, plain = _verdicts(SEQUENCE_PARALLEL, tmp_path, sandbox)
    assert memoized is not None and memoized.verdict == "verified", memoized
    assert memoized.stats["templates"] == 1 and memoized.stats["block_instances"] == 8, memoized.stats
    assert memoized.stats["templates_entered_sharded"] == 1
    assert "8 repeated blocks verified as 1 distinct, 1 of them entered sharded" in memoized.summary
    assert full.verdict == plain.verdict == "verified"
    assert full.stats["templates"] == 1 and "templates" not in plain.stats


def test_a_layer_fed_another_block_of_the_sequence_is_not_covered_by_the_template(tmp_path: Path, sandbox) -> None:
    # Layer 3 receives the next rank's block: the same shapes, the same record, so the template
    # is the same; only the relation its inputs have in the skeleton tells it apart.
    source = _variant(LOOP, LOOP + "            if i == 3:\n                x = own_block(gather(x), shift=1)\n")
    memoized, full, plain = _verdicts(source, tmp_path, sandbox)
    assert memoized is None
    assert full.verdict == plain.verdict != "verified", full.summary


def test_a_layer_fed_the_same_block_on_every_rank_is_not_covered_by_the_template(tmp_path: Path, sandbox) -> None:
    # Every rank feeds layer 5 the first block of the sequence (replicated across the ranks, in
    # the shape of a shard): again the template's record, not its contract.
    first_block = "            if i == 5:\n                x = gather(x)[:, : x.shape[1]].contiguous()\n"
    source = _variant(LOOP, LOOP + first_block)
    memoized, full, plain = _verdicts(source, tmp_path, sandbox)
    assert memoized is None
    assert full.verdict == plain.verdict != "verified", full.summary


def test_a_layer_missing_its_reduce_scatter_is_not_verified(tmp_path: Path, sandbox) -> None:
    # Layer 6 keeps its block of the partial sums: a template of its own, whose proof fails
    source = _variant(
        BLOCK_RETURN,
        "        if self.index == 6:\n            return x + own_block(partial)\n" + BLOCK_RETURN,
    )
    memoized, full, plain = _verdicts(source, tmp_path, sandbox)
    assert memoized is None
    assert full.verdict == plain.verdict != "verified", full.summary


def test_a_template_returning_another_block_than_the_next_layer_assumes_is_not_verified(
    tmp_path: Path, sandbox
) -> None:
    # Every layer returns the next rank's block of its output: a consistent layer in itself, but
    # its output is not the block the following layer (and its own contract) assumes.
    source = _variant(BLOCK_RETURN, "        return own_block(gather(x + reduce_scatter(partial)), shift=1)\n")
    memoized, full, plain = _verdicts(source, tmp_path, sandbox)
    assert memoized is None
    assert full.verdict == plain.verdict != "verified", full.summary


def test_a_layer_entered_whole_among_layers_entered_sharded_is_not_covered_by_their_template(
    tmp_path: Path, sandbox
) -> None:
    # Layer 2 receives the whole sequence and returns this rank's block of its output: correct,
    # but under another contract (input equal, output sharded) than the other layers', so their
    # template does not stand for it; the run that traces every layer verifies it.
    source = _variant(LOOP, LOOP + "            if i == 2:\n                x = gather(x)\n")
    source = source.replace(
        "    def forward(self, x):\n        partial = F.linear(torch.relu(F.linear(gather(x), self.up)), self.down)\n"
        "        return x + reduce_scatter(partial)\n",
        "    def forward(self, x):\n        whole = x.shape[1] == 8\n"
        "        partial = F.linear(torch.relu(F.linear(x if whole else gather(x), self.up)), self.down)\n"
        "        return (own_block(x) if whole else x) + reduce_scatter(partial)\n",
    )
    assert "whole = x.shape[1] == 8" in source
    memoized, full, plain = _verdicts(source, tmp_path, sandbox)
    assert memoized is None
    assert full.verdict == plain.verdict == "verified", full.summary


LLAMA_AT_DEPTH = """
from llama_example.model import Llama, LlamaConfig, example_inputs

CONFIG = LlamaConfig(n_layers={layers})


def build():
    return Llama(CONFIG)


def inputs():
    return example_inputs(CONFIG)
"""


@pytest.mark.parametrize("layers", [3, 8])
def test_the_example_sequence_parallel_check_is_verified_through_its_templates(
    layers: int, tmp_path: Path, sandbox
) -> None:
    (tmp_path / "deep_llama.py").write_text(LLAMA_AT_DEPTH.format(layers=layers))
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.shardproof]\npython-path = [".", "{(EXAMPLES / "llama").as_posix()}"]\n\n'
        '[[tool.shardproof.check]]\nname = "sp"\nreference = "deep_llama:build"\n'
        'parallel = "llama_example.sp:parallelize"\ninputs = "deep_llama:inputs"\n'
        'world-sizes = [4]\noutputs = "replicated"\n'
    )
    project = load_project(tmp_path)
    check = project.check("sp")
    (memoized,) = verify_check(check, project, [4], sandbox, numeric_witness=False).results
    (plain,) = verify_check(check, project, [4], sandbox, numeric_witness=False, memoize=False).results
    assert memoized.verdict == plain.verdict == "verified", memoized.summary
    assert memoized.stats["templates"] == 1 and memoized.stats["block_instances"] == layers, memoized.stats
    assert memoized.stats["templates_entered_sharded"] == 1 and "parts" not in memoized.stats
    assert plain.stats["parts"] > layers
