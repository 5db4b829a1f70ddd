"""Real-world parallel code from PyPI (fairscale, Megatron-core): one parallel model, the same
code at world size 1 as the reference; torch's DTensor plans against the plain model. Mistakes
are reported at the user's line (a plan entry for a plan mistake), and the static verdicts are
cross-checked with real numbers (every rank in its own process on a gloo group for the libraries,
real DTensor on threads for plans)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from realworld_variants import EXAMPLES, VARIANTS

from shardproof.config import load_project
from shardproof.pipeline import verify_check
from shardproof.witness import numeric
from shardproof.witness.run import compare_numerically, witness

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("example", "name"),
    [
        # VocabParallelEmbedding: vocabulary shards, masked lookups summed by an all-reduce
        ("fairscale_llama", "fairscale-llama3"),
        # ParallelEmbedding: model-dim shards, all-gathered
        ("fairscale_llama", "fairscale-llama2"),
        # fairscale's vocab_parallel_cross_entropy of logits sharded over the vocabulary: a MAX
        # all-reduce, the target's logit picked by x[arange(N), ids] on its rank, summed
        ("fairscale_llama", "fairscale-llama3-loss"),
        # Megatron-core's vocab_parallel_cross_entropy (float32 upcast, in-place shifts and exp)
        ("megatron_gpt", "megatron-loss"),
        # Megatron-core's Column/RowParallelLinear and VocabParallelEmbedding, fused per-head QKV
        ("megatron_gpt", "megatron-tp"),
        # the same with sequence parallelism: scatter, all-gather and reduce-scatter on the sequence dim
        ("megatron_gpt", "megatron-sp"),
        # Megatron-core's GPTModel (local spec): rotary, fused QKV over sharded heads, gated MLP
        ("megatron_gpt", "megatron-gptmodel"),
        # Meta's Llama 3 code from llama-models: complex rotary, KV cache written in the forward
        ("llama_models_meta", "llama-models-llama3"),
        # the same with a user's attention override (scaled_dot_product_attention with a mask)
        ("llama_models_meta", "llama-models-sdpa"),
    ],
)
def test_library_model_is_verified_against_itself_at_world_size_1(example: str, name: str, sandbox) -> None:
    project = load_project(EXAMPLES / example)
    check = project.check(name)
    assert check.same_code_reference
    result = verify_check(check, project, [2, 4], sandbox)
    assert result.error is None, result.error
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]
    for r in result.results:
        assert [o.relation for o in r.outputs] == ["replicated"]
        # verified one block for all its layers (memoized), or else in parts at once: before the
        # first layer, and each layer (or its sub-modules)
        assert r.stats.get("templates", 0) >= 1 or r.stats.get("parts", 0) >= 3, r.stats
        # Cross-check: proven equal, so numerically equal too (float64, random weights, every input trial).
        numbers = compare_numerically(check, project, r.world_size)
        assert not numbers.differs, (
            f"{name} at world size {r.world_size} is proven equal but differs numerically: {numbers.to_dict()}"
        )
        assert numbers.outputs and all(o.max_rel <= numeric.RELATIVE_TOLERANCE for o in numbers.outputs)


@pytest.mark.parametrize(
    ("example", "name"),
    [
        # parallelize_module with Colwise/Rowwise/SequenceParallel/PrepareModuleInput, torchtitan style;
        # parameter relations come from the DTensor placements
        ("dtensor_llama", "dtensor-tp"),
        ("dtensor_llama", "dtensor-sp"),
        # transformers' built-in tp_plan on a tiny Llama, as from_pretrained(distributed_config=...) applies it
        ("hf_llama", "hf-llama-tp"),
        # Phi-3's packed gate_up_proj sharded part by part (packed_colwise: a strided DTensor placement)
        ("hf_llama", "hf-phi3-packed"),
    ],
)
def test_dtensor_plan_is_verified_against_the_plain_model(example: str, name: str, sandbox) -> None:
    project = load_project(EXAMPLES / example)
    check = project.check(name)
    assert not check.same_code_reference
    result = verify_check(check, project, [2, 4], sandbox)
    assert result.error is None, result.error
    assert [(r.world_size, r.verdict) for r in result.results] == [(2, "verified"), (4, "verified")], [
        r.summary for r in result.results
    ]
    for r in result.results:
        assert r.stats.get("parts", 0) >= 3, r.stats  # verified in parts at once
        numbers = compare_numerically(check, project, r.world_size)
        assert not numbers.differs, numbers.to_dict()
        assert numbers.outputs and all(o.max_rel <= numeric.RELATIVE_TOLERANCE for o in numbers.outputs)


def test_a_plan_mistake_is_reported_at_its_plan_entry_with_the_module_call_related(variant_projects, sandbox) -> None:
    root = variant_projects["dtensor-output-not-replicated"]
    project = load_project(root)
    result = verify_check(project.check("dtensor-tp"), project, [2], sandbox)
    finding = result.results[0].discrepancies[0]
    assert finding.primary is not None and finding.primary.file.endswith("parallel.py")
    assert finding.primary.code.startswith('"output"'), finding.primary
    runs = [s for s in finding.related if s.file.endswith("model.py")]
    assert runs and runs[0].code == "return self.output(self.norm(h))" and "`output` runs here" in runs[0].note
    assert "plan entry for `output`" in finding.suggestion


def test_a_plan_entry_that_breaks_the_shapes_is_named_by_the_error(tmp_path: Path, sandbox) -> None:
    # o_proj planned column-wise: the rank's local heads meet a weight sharded the other way, a
    # shape error inside the module; the error points at the plan entry, not into transformers.
    root = tmp_path / "hf"
    shutil.copytree(EXAMPLES / "hf_llama", root, ignore=shutil.ignore_patterns("__pycache__"))
    source = root / "hf_tp" / "model.py"
    text = source.read_text()
    entry = '"model.layers.*.self_attn.o_proj": "rowwise",'
    assert text.count(entry) == 1
    source.write_text(text.replace(entry, '"model.layers.*.self_attn.o_proj": "colwise",'))
    line = next(i + 1 for i, text in enumerate(source.read_text().splitlines()) if "self_attn.o_proj" in text)
    project = load_project(root)
    (outcome,) = verify_check(project.check("hf-llama-tp").for_mode("quick"), project, [2], sandbox).results
    assert outcome.verdict == "error", outcome.summary
    assert outcome.error is not None
    site = outcome.error["site"]
    assert (Path(site["file"]), site["line"]) == (source, line), outcome.error
    assert "raised inside `model.model.layers.0.self_attn.o_proj`" in outcome.error["message"]
    assert "parallelizes with colwise" in outcome.error["message"]


def test_a_transformers_plan_entry_is_reported_with_the_layout_it_declares(tmp_path: Path, sandbox) -> None:
    # The LM head overridden `colwise` (the model's own plan gathers it): each rank returns its
    # vocabulary shard. transformers applies the style name itself; the report is at the override,
    # saying what that style hands on (read from transformers' own style object).
    root = tmp_path / "hf"
    shutil.copytree(EXAMPLES / "hf_llama", root, ignore=shutil.ignore_patterns("__pycache__"))
    source = root / "hf_tp" / "model.py"
    text = source.read_text()
    entry = '    "model.layers.*.self_attn.o_proj": "rowwise",\n    "model.layers.*.mlp.down_proj": "rowwise",\n}'
    assert text.count(entry) == 1
    source.write_text(
        text.replace(entry, '    "model.layers.*.self_attn.o_proj": "rowwise",\n    "lm_head": "colwise",\n}')
    )
    line = next(i + 1 for i, text in enumerate(source.read_text().splitlines()) if '"lm_head": "colwise"' in text)
    project = load_project(root)
    (outcome,) = verify_check(project.check("hf-llama-tp").for_mode("quick"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.primary is not None and (Path(finding.primary.file), finding.primary.line) == (source, line)
    assert "it hands the output on as Shard(-1)" in finding.suggestion, finding.suggestion
    runs = [s for s in finding.related if "`model.lm_head` runs here" in s.note]
    assert runs and runs[0].code.startswith("return self.model("), finding.related


@pytest.fixture(scope="module")
def variant_projects(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("realworld-variants")
    return {v.name: v.materialize(root / v.name) for v in VARIANTS}


@pytest.mark.parametrize("name", [v.name for v in VARIANTS])
@pytest.mark.parametrize("world_size", [2, 4])
def test_library_mistake_is_reported_at_the_users_line(name: str, world_size: int, variant_projects, sandbox) -> None:
    bug = next(v for v in VARIANTS if v.name == name)
    root = variant_projects[name]
    project = load_project(root)
    result = verify_check(project.check(bug.check), project, [world_size], sandbox)
    (outcome,) = result.results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.kind == bug.kind, finding.message
    assert finding.primary is not None
    # In the user's model, never inside the library.
    assert Path(finding.primary.file) == root / bug.file
    assert finding.primary.line == bug.line_number(root), finding.message
    assert "site-packages" not in finding.primary.file
    # Confirmed with real numbers: the ranks, each in its own process, differ from world size 1.
    found = finding.witness
    assert found is not None and found["status"] == "confirmed", f"{name} at world size {world_size}: {found}"
    assert found["world_size"] == world_size
    assert any(o["max_rel"] is None or o["max_rel"] > numeric.RELATIVE_TOLERANCE for o in found["outputs"]), found


def test_a_library_frame_is_related_information_not_the_site(variant_projects, sandbox) -> None:
    root = variant_projects["fairscale-lm-head-not-gathered"]
    project = load_project(root)
    result = verify_check(project.check("fairscale-llama3"), project, [2], sandbox)
    finding = result.results[0].discrepancies[0]
    inside = [s for s in finding.related if "fairscale" in s.file]
    assert inside and inside[0].note.startswith("inside fairscale"), finding.related


def test_megatron_label_smoothing_over_the_local_vocabulary_is_found(tmp_path: Path, sandbox) -> None:
    """A real, unfixed Megatron-core bug (Megatron-LM #737, #7464; megatron-core 0.16.1): with label
    smoothing, vocab_parallel_cross_entropy averages the log-probabilities over this rank's
    vocabulary shard (and takes the shard's size for the vocabulary's), so the loss depends on the
    tensor-parallel size. Reported at the user's call, with the library's line as related
    information, and confirmed with real numbers."""
    root = shutil.copytree(EXAMPLES / "megatron_gpt", tmp_path / "megatron_gpt")
    model = root / "mg_gpt" / "model.py"
    model.write_text(model.read_text().replace("    label_smoothing = 0.0\n", "    label_smoothing = 0.1\n"))
    project = load_project(root)
    (outcome,) = verify_check(project.check("megatron-loss"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.primary is not None and finding.primary.file.endswith("mg_gpt/model.py")
    lines = model.read_text().splitlines()
    call = next(i + 1 for i, line in enumerate(lines) if "vocab_parallel_cross_entropy(" in line)
    assert finding.primary.line == call
    # the mean is captured as a sum and a division: the rank's sum over its vocabulary block is a
    # partial sum of the reference's, divided (by its block's size) without an all-reduce
    assert "mean" in finding.message and "partial sum" in finding.message, finding.message
    assert "[0:128] of 256" in finding.found, finding.found
    inside = [s for s in finding.related if s.file.endswith("tensor_parallel/cross_entropy.py")]
    assert inside and "inside megatron" in inside[0].note, finding.related
    assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness


SAME_CODE_MODEL = """
import torch
import torch.distributed as dist
from fairscale.nn.model_parallel.layers import ColumnParallelLinear, RowParallelLinear
from torch import nn


def keep(weight):
    return weight


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(8, 16, bias=False, gather_output=False, init_method=keep)
        self.down = RowParallelLinear(16, 8, bias=False, input_is_parallel=True, init_method=keep)

    def forward(self, x):
        return self.down(self.up(x))


class WaitsAlone(MLP):
    def forward(self, x):
        y = super().forward(x)
        if dist.get_rank() == 1:
            dist.all_reduce(y)  # the other rank never joins this one
            dist.all_reduce(y)
        return y


class ScaledInGradMode(MLP):
    # A deterministic table kept as a plain attribute (export lifts it as a constant) and a
    # residual added under enable_grad (export wraps it in a grad-mode region), as Megatron does.

    def __init__(self):
        super().__init__()
        self.scale = torch.arange(1, 9).float() / 8

    def forward(self, x):
        y = super().forward(x)
        with torch.enable_grad():
            y = y * self.scale + x
        return y


def build():
    return MLP()


def build_scaled_in_grad_mode():
    return ScaledInGradMode()


def build_failing_on_rank_1():
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 cannot find its checkpoint shard")
    return MLP()


def build_waits_alone():
    return WaitsAlone()


def inputs():
    return (torch.randn(2, 8),)
"""


@pytest.fixture
def same_code_project(tmp_path: Path):
    (tmp_path / "sc_model.py").write_text(SAME_CODE_MODEL)
    checks = "".join(
        f"""
[[tool.shardproof.check]]
name = "{name}"
parallel = "sc_model:{builder}"
reference = {{ world-size = 1 }}
inputs = "sc_model:inputs"
world-sizes = [2]
outputs = "replicated"
"""
        for name, builder in [
            ("mlp", "build"),
            ("fails", "build_failing_on_rank_1"),
            ("waits", "build_waits_alone"),
            ("scaled", "build_scaled_in_grad_mode"),
        ]
    )
    (tmp_path / "pyproject.toml").write_text('[tool.shardproof]\npython-path = ["."]\n' + checks)
    return load_project(tmp_path)


def test_a_rank_that_fails_in_its_process_is_the_reason_no_witness_exists(same_code_project) -> None:
    found = witness(same_code_project.check("fails"), same_code_project, 2)
    assert found["status"] == "not-run"
    assert "rank 1: RuntimeError: rank 1 cannot find its checkpoint shard" in found["reason"], found


def test_ranks_that_never_meet_are_stopped_at_the_deadline(same_code_project, monkeypatch) -> None:
    monkeypatch.setattr(numeric, "RUN_TIMEOUT_SECONDS", 5.0)
    found = witness(same_code_project.check("waits"), same_code_project, 2)
    assert found["status"] == "not-run"
    # Rank 1's extra collectives pair with rank 0's own, so both end up waiting: both are stopped.
    assert "the ranks did not finish within 5 s" in found["reason"], found


def test_a_same_code_model_too_large_to_run_says_so(same_code_project, monkeypatch) -> None:
    monkeypatch.setattr(numeric, "MAX_PARAMETER_ELEMENTS", 100)
    found = witness(same_code_project.check("mlp"), same_code_project, 2)
    assert found["status"] == "not-run"
    assert "the model has 256 parameter elements, too many to run" in found["reason"], found


def test_tensor_attributes_and_grad_mode_regions_are_followed(same_code_project, sandbox) -> None:
    result = verify_check(same_code_project.check("scaled"), same_code_project, [2], sandbox)
    assert result.error is None, result.error
    assert [r.verdict for r in result.results] == ["verified"], [r.summary for r in result.results]
    numbers = compare_numerically(same_code_project.check("scaled"), same_code_project, 2)
    assert not numbers.differs, numbers.to_dict()


def test_a_packed_weight_needs_its_layout_declared(tmp_path: Path, sandbox) -> None:
    """Without `packed-shard:0:2`, the gated MLP's [gate; up] weight is taken as one contiguous
    block per rank: a real difference, found statically and confirmed with numbers."""
    root = tmp_path / "megatron_gpt"
    shutil.copytree(EXAMPLES / "megatron_gpt", root, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text[: text.index("[tool.shardproof.check.parameters]")])
    project = load_project(root)
    (outcome,) = verify_check(project.check("megatron-gptmodel"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert finding.kind == "wrong-shard", finding.message
    assert "linear_fc1" in finding.message
    assert finding.witness is not None and finding.witness["status"] == "confirmed", finding.witness


def test_a_missing_sequence_scatter_is_named_at_the_gather_that_repeats_the_value(tmp_path: Path, sandbox) -> None:
    """Megatron's sequence-parallel model without `scatter_to_sequence_parallel_region`: the first
    column-parallel layer all-gathers a value every rank holds whole. The missing line has no
    operation to point at, so the report names the gather and says what is missing."""
    root = tmp_path / "megatron_gpt"
    shutil.copytree(EXAMPLES / "megatron_gpt", root, ignore=shutil.ignore_patterns("__pycache__"))
    model = root / "mg_gpt/model.py"
    text = model.read_text()
    assert text.count("h = scatter_to_sequence_parallel_region(h)") == 1
    model.write_text(text.replace("h = scatter_to_sequence_parallel_region(h)", "pass"))
    project = load_project(root)
    (outcome,) = verify_check(project.check("megatron-sp"), project, [2], sandbox).results
    assert outcome.verdict == "discrepancy", outcome.summary
    finding = outcome.discrepancies[0]
    assert "all-gather of a value every rank already holds in full" in finding.message, finding.message
    assert finding.suggestion.startswith("scatter the value before this gather")
    assert finding.primary is not None and Path(finding.primary.file) == model
