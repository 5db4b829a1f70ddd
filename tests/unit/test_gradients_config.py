"""Declaring gradient checks, and which block of a rank gradient stands for which reference
gradient (capture/gradients.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.capture.gradients import GradientPart, gradient_parts
from shardproof.config import Gradients, parse_project
from shardproof.errors import ConfigError
from shardproof.relations.expr import CatOf, ParamRef, ScaleOf, SliceOf

CHECK = """
[tool.shardproof]

[[tool.shardproof.check]]
name = "grads"
reference = "m.model:build"
parallel = "m.tp:parallelize"
inputs = "m.model:inputs"
world-sizes = [2]
outputs = "{outputs}"
{gradients}
"""


def parse(outputs: str, gradients: str):
    text = CHECK.format(outputs=outputs, gradients=gradients)
    return parse_project(text, Path("/proj/pyproject.toml")).checks[0]


def test_gradients_true_differentiates_the_outputs() -> None:
    assert parse("replicated", "gradients = true").gradients == Gradients(None, None)
    assert parse("replicated", "").gradients is None


def test_a_gradients_table_names_the_steps() -> None:
    check = parse(
        "sharded",
        '[tool.shardproof.check.gradients]\nreference-step = "m.train:ref"\nparallel-step = "m.train:par"',
    )
    assert check.gradients is not None
    assert (check.gradients.reference_step, check.gradients.parallel_step) == ("m.train:ref", "m.train:par")


@pytest.mark.parametrize(
    ("outputs", "gradients", "message", "line"),
    [
        ("sharded", "gradients = true", 'must be "replicated"', 11),
        ("last-rank", "gradients = true", "pipeline stages", 11),
        ("replicated", 'gradients = "yes"', "must be true or a table", 11),
        ("replicated", "[tool.shardproof.check.gradients]\nstep = 'm.a:b'", "unknown key(s) in `gradients`: step", 11),
        (
            "replicated",
            "[tool.shardproof.check.gradients]\nparallel-step = 'not a spec'",
            "parallel-step` must be",
            12,
        ),
    ],
)
def test_bad_gradient_declarations_are_reported_at_their_line(outputs, gradients, message, line) -> None:
    with pytest.raises(ConfigError) as error:
        parse(outputs, gradients)
    assert message in error.value.message
    assert error.value.site is not None and error.value.site.line == line


def _ref(name: str, shape: tuple[int, ...]) -> ParamRef:
    return ParamRef(name=name, shape=shape, dtype="float32")


def test_a_replicated_parameter_shows_the_whole_gradient() -> None:
    parts = gradient_parts({"norm.weight": _ref("norm.weight", (16,))}, {"norm.weight"})
    assert parts == {"norm.weight": GradientPart("norm.weight", "norm.weight")}


def test_a_sharded_parameter_shows_its_block() -> None:
    weight = _ref("up.weight", (32, 16))
    block = SliceOf(source=weight, dim=-2, start=16, end=32, shape=(16, 16), dtype="float32")
    parts = gradient_parts({"up.weight": block}, {"up.weight"})
    assert parts == {"up.weight": GradientPart("up.weight", "up.weight", -2, 16, 32, 0)}


def test_a_packed_parameter_shows_each_reference_block_at_its_offset() -> None:
    gate, up = _ref("gate.weight", (32, 16)), _ref("up.weight", (32, 16))
    packed = CatOf(
        parts=(
            SliceOf(source=gate, dim=-2, start=0, end=16, shape=(16, 16), dtype="float32"),
            SliceOf(source=up, dim=-2, start=0, end=16, shape=(16, 16), dtype="float32"),
        ),
        dim=-2,
        shape=(32, 16),
        dtype="float32",
    )
    parts = gradient_parts({"gate_up.weight": packed}, {"gate_up.weight"})
    assert parts["gate.weight"] == GradientPart("gate.weight", "gate_up.weight", -2, 0, 16, 0)
    assert parts["up.weight"] == GradientPart("up.weight", "gate_up.weight", -2, 0, 16, 16)


def test_a_trainable_holder_is_preferred_and_a_share_holds_nothing() -> None:
    bias = _ref("o.bias", (16,))
    share = ScaleOf(source=bias, factor=0.5, shape=(16,), dtype="float32")  # type: ignore[arg-type]
    assert gradient_parts({"o.bias": share}, {"o.bias"}) == {}
    parts = gradient_parts({"a.frozen_copy": bias, "b.trained": bias}, {"b.trained"})
    assert parts["o.bias"].rank_parameter == "b.trained"
