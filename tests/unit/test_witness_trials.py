"""What the numeric witness tries, and what counts as numbers that differ."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from shardproof.graph.model import Graph, Node, Placeholder, TensorMeta
from shardproof.witness.compare import FLOAT32_TOLERANCE, compare_module, compare_runs
from shardproof.witness.numeric import NumericComparison, NumericRunError, RunTimedOut, in_dtypes
from shardproof.witness.trials import compared_constants, input_trials, shard_boundaries


def test_shard_boundaries_cover_even_and_ceil_splits_and_the_last_id() -> None:
    # 10 ids over 4 ranks: floor blocks start at 2, 5, 7; ceil blocks (3 each) at 3, 6, 9
    assert shard_boundaries(10, 4) == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
    assert shard_boundaries(64, 2) == {0, 31, 32, 63}


def test_the_witness_tries_the_integers_the_programs_compare_against() -> None:
    meta = TensorMeta((2, 4), "int64")
    graph = Graph(
        "rank0",
        0,
        2,
        [Placeholder("ids", "input", "0", meta)],
        [
            Node("lo", "scalar", ("ids",), {"fn": "ge", "value": 20}, TensorMeta((2, 4), "bool")),
            Node("hi", "scalar", ("ids",), {"fn": "lt", "value": 40}, TensorMeta((2, 4), "bool")),
            Node("scaled", "scalar", ("ids",), {"fn": "mul", "value": 3}, meta),
            Node("flag", "scalar", ("ids",), {"fn": "eq", "value": True}, TensorMeta((2, 4), "bool")),
        ],
        ["lo"],
    )
    assert compared_constants([graph]) == [20, 40]
    model = nn.Embedding(64, 4)
    ids = torch.zeros(4, 8, dtype=torch.int64)
    trials = dict(input_trials(model, (ids,), 2, seed=0, compared=[20, 40]))
    chosen = trials["token ids at the values the programs compare against (19, 20, 21, 39, 40, 41)"][0]
    assert {19, 20, 21, 39, 40, 41} <= set(chosen.flatten().tolist())
    assert {0, 31, 32, 63} <= set(trials["token ids at every vocabulary shard boundary"][0].flatten().tolist())
    assert "random inputs" in trials


def test_floating_inputs_are_also_tried_at_a_larger_magnitude() -> None:
    trials = dict(input_trials(nn.Linear(4, 4), (torch.randn(2, 4),), 2, seed=0))
    assert list(trials) == ["the example inputs", "random inputs", "random inputs of larger magnitude (x100)"]
    assert trials["random inputs of larger magnitude (x100)"][0].abs().max() > 10


def test_the_localized_module_is_evidence_only_where_no_layout_explains_the_difference() -> None:
    reference = torch.randn(3, 4, dtype=torch.float64)
    halves = [reference * 0.25, reference * 0.75]
    assert not compare_module("m", reference, [reference, reference], 1e-6).differs  # replicated
    assert not compare_module("m", reference, halves, 1e-6).differs  # partial sums
    assert not compare_module("m", reference, [reference, reference - 1.0], 1e-6).differs  # partial maxima
    sharded = compare_module("m", reference, [reference[:, :2], reference[:, 2:]], 1e-6)
    assert not sharded.differs and not sharded.comparable and "each rank holds a part" in sharded.note
    assert compare_module("m", reference, [reference * 2, reference * 2], 1e-6).differs


def test_outputs_compare_under_the_declared_relation() -> None:
    reference = torch.randn(2, 6, dtype=torch.float64)
    shards = [[reference[:, :3]], [reference[:, 3:]]]
    assert not compare_runs([reference], shards, {}, 2, "sharded", "", "full").differs
    assert compare_runs([reference], shards, {}, 2, "replicated", "", "full").differs
    missing = compare_runs([reference], [[reference], []], {}, 2, "replicated", "", "full")
    assert missing.differs and math.isinf(missing.outputs[0].max_rel)


def agreeing(dtype: torch.dtype) -> list[NumericComparison]:
    return [NumericComparison(2, "full", inputs="the example inputs", tolerance=FLOAT32_TOLERANCE)]


def test_a_model_that_refuses_float64_runs_in_float32() -> None:
    def attempt(dtype: torch.dtype) -> list[NumericComparison]:
        if dtype == torch.float64:
            raise NumericRunError("RuntimeError: Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double")
        return agreeing(dtype)

    result = in_dtypes(attempt, 2, "full")
    assert result.dtype == "float32" and not result.differs
    assert result.notes == [
        "not run in float64: RuntimeError: Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double"
    ]
    assert len(result.trials) == 1


def test_a_failing_rank_is_shown_only_when_it_fails_in_every_dtype() -> None:
    def failing(dtype: torch.dtype) -> list[NumericComparison]:
        return [NumericComparison(2, "full", inputs="random inputs", failure=f"rank 1: IndexError ({dtype})")]

    shown = in_dtypes(failing, 2, "full")
    assert shown.differs and shown.dtype == "float64" and "fails in float32 too" in shown.notes[0]

    def only_in_float64(dtype: torch.dtype) -> list[NumericComparison]:
        return failing(dtype) if dtype == torch.float64 else agreeing(dtype)

    dtype_caused = in_dtypes(only_in_float64, 2, "full")
    assert not dtype_caused.differs and dtype_caused.dtype == "float32"


def test_ranks_that_never_finish_are_not_run_again_in_another_dtype() -> None:
    calls: list[torch.dtype] = []

    def hangs(dtype: torch.dtype) -> list[NumericComparison]:
        calls.append(dtype)
        raise RunTimedOut("the ranks did not finish within 120 s")

    with pytest.raises(RunTimedOut):
        in_dtypes(hangs, 2, "full")
    assert calls == [torch.float64]


def test_when_no_dtype_runs_the_reason_is_said_once() -> None:
    def never(dtype: torch.dtype) -> list[NumericComparison]:
        raise NumericRunError("rank 1: RuntimeError: cannot find its checkpoint shard")

    with pytest.raises(NumericRunError, match=r"^rank 1: RuntimeError: cannot find its checkpoint shard$"):
        in_dtypes(never, 2, "full")
