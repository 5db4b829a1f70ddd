"""wrong-constant: the rank runs the reference's operation on related inputs with another number
(a scale from the local head count). Reported where the number is computed (the assignment of the
name the operation reads) when the user's source has one, else at the operation. The same number,
an input that is wrong too, or another operation, is not this mistake.

Tested through `wrong_constant(ctx, node, rank)` only: the detector and assignments.py are being
reworked, and these cases state what a user sees."""

from __future__ import annotations

import textwrap
from pathlib import Path

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.graph.model import Frame
from shardproof.localize.detectors.wrong_constant import wrong_constant

SHAPE = (2, 4, 8, 8)
HEAD_DIM, LOCAL_HEAD_DIM = 8**-0.5, 16**-0.5  # the reference's scale; one from the width of two heads


def _kit(
    scale: float = LOCAL_HEAD_DIM, *, fn: str = "mul", related: bool = True, frames: tuple[Frame, ...] = ()
) -> Kit:
    """`y = scores * 8 ** -0.5` in the reference (line 10); rank r scales its block r of heads'
    scores by `scale` with `fn` (line 41, or at `frames`)."""
    kit = Kit()
    kit.input("x", *SHAPE)
    kit.ref.op("scores", "matmul", "x", "x", out=SHAPE, line=9)
    kit.ref.op("y", "scalar", "scores", out=SHAPE, line=10, fn="mul", value=HEAD_DIM)
    for r, rank in kit.each_rank():
        rank.op("scores", "matmul", "x", "x", out=(2, 2, 8, 8), line=40)
        if related:
            kit.sel("scores", f"rank{r}/scores", -3, (2 * r, 2 * r + 2))
        rank.op("y", "scalar", "scores", out=(2, 2, 8, 8), line=41, frames=frames, fn=fn, value=scale)
    return kit


def _check(kit: Kit, ref_value: str = "y"):
    ctx = kit.context()
    return wrong_constant(ctx, ctx.ref_nodes[ref_value], 1)


def test_a_scale_from_the_local_sizes_is_reported_at_the_operation_without_source() -> None:
    found = _check(_kit())
    assert found is not None and found.kind == "wrong-constant"
    assert at(found) == (PARALLEL_FILE, 41)
    assert (
        found.message
        == "rank 1 computes the reference's mul by 0.353553 with the number 0.25 where the reference uses 0.353553"
    )
    assert found.expected.startswith("0.353553,") and found.found == "0.25"
    assert found.suggestion == "use 0.353553 here"
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 10)


SOURCE = """
import math


class Attention:
    def __init__(self, width, heads, world_size):
        self.scale = 1 / math.sqrt(width // heads * world_size)

    def forward(self, scores):
        return scores * self.scale
"""


def test_a_scale_assigned_in_the_users_source_is_reported_at_its_assignment(tmp_path: Path) -> None:
    path = tmp_path / "attention.py"
    path.write_text(textwrap.dedent(SOURCE))
    lines = path.read_text().splitlines()
    use = next(i for i, line in enumerate(lines, 1) if "scores * self.scale" in line)
    start = lines[use - 1].index("scores * self.scale")
    expression = Frame(str(path), use, "forward", "scores * self.scale", start, use, start + len("scores * self.scale"))
    found = _check(_kit(frames=(expression,)))
    assert found is not None and found.kind == "wrong-constant"
    assigned = next(i for i, line in enumerate(lines, 1) if "self.scale = " in line)
    assert at(found) == (str(path), assigned)
    assert found.message.endswith("where the reference uses 0.353553 (self.scale)")
    assert [(s.file, s.line) for s in found.related] == [(str(path), use)]
    assert "from the whole model's sizes" in found.suggestion


def test_the_references_number_is_right() -> None:
    assert _check(_kit(HEAD_DIM)) is None
    assert _check(_kit(HEAD_DIM * (1 + 1e-12))) is None  # the same number, computed another way


def test_a_number_on_an_input_that_is_wrong_too_is_not_only_the_number() -> None:
    assert _check(_kit(related=False)) is None


def test_another_operation_is_not_a_number_of_the_references() -> None:
    assert _check(_kit(fn="div")) is None
    kit = _kit()
    assert _check(kit, "scores") is None  # a matmul has no number
