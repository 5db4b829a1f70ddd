"""An output that fails though no value before it is broken (detectors/output_mismatch.py): a
wrong shape (wrong-layout), every rank's output a slice (shard-order), partial sums returned
(missing-reduction; for a gradient, all-reduce it after backward), an all-reduce of partial sums
that do not tile (wrong-shard). The last resort never declines, so its near misses are the kinds
it must not claim: a shape that matches, an all-reduce of partial sums that do tile."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.graph.model import GradientRole
from shardproof.localize.detectors.output_mismatch import output_mismatch

SHAPE = (2, 8, 16)
RETURNED = 41


def _kit(rank_shape: tuple[int, ...] = SHAPE) -> Kit:
    """The reference returns `y = up(x)` (line 10); each rank returns its own `y` (line 41)."""
    kit = Kit()
    kit.input("x", *SHAPE)
    kit.ref.op("y", "linear", "x", out=SHAPE, line=10, module="mlp.up")
    kit.ref.output("y")
    for _, rank in kit.each_rank():
        rank.op("y", "linear", "x", out=rank_shape, line=RETURNED, module="mlp.up")
        rank.output("y")
    return kit


def test_an_output_of_another_shape_is_a_wrong_layout_at_the_returned_value() -> None:
    kit = _kit((2, 8, 8))
    kit.blocks("y", "rank{rank}/y", -1, 16)
    found = output_mismatch(kit.context(), [0])
    assert found.kind == "wrong-layout" and at(found) == (PARALLEL_FILE, RETURNED)
    assert found.message == "rank 0 returns output 0 with shape [2, 8, 8]; the reference returns [2, 8, 16]"
    assert found.expected == "shape [2, 8, 16]" and found.found == "shape [2, 8, 8]"
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 10)
    assert found.details["neighbourhood"]["links"][0]["label"] == "shape [2, 8, 8] ≠ [2, 8, 16]"


def test_outputs_that_are_slices_in_another_order_are_a_shard_order() -> None:
    kit = _kit()
    for r, _ in kit.each_rank():
        kit.sel("y", f"rank{r}/y", -1, (8, 16), (0, 8))
    found = output_mismatch(kit.context(), [0])
    assert found.kind == "shard-order" and at(found) == (PARALLEL_FILE, RETURNED)
    assert "output 0 does not equal the reference's on every rank" in found.message
    assert "rank 0: the slice [8:16], [0:8] of dim 2 (size 16)" in found.found


def test_partial_sums_returned_are_a_missing_reduction() -> None:
    kit = _kit()
    kit.partial_blocks("y", "rank{rank}/y", 16)
    found = output_mismatch(kit.context(), [0])
    assert found.kind == "missing-reduction" and at(found) == (PARALLEL_FILE, RETURNED)
    assert found.found == (
        "rank 0: a partial sum over [0:8] of the 16 reduced indices; "
        "rank 1: a partial sum over [8:16] of the 16 reduced indices"
    )
    assert found.suggestion == "combine the ranks' results so that each returns the full output"


def test_a_gradient_returned_unreduced_is_all_reduced_after_backward() -> None:
    kit = _kit()
    kit.partial_blocks("y", "rank{rank}/y", 16)
    kit.ref.graph.gradient_roles = [GradientRole("up.weight")]
    found = output_mismatch(kit.context(), [0])
    assert found.kind == "missing-reduction"
    assert found.message.startswith("the gradient of `up.weight` does not equal the reference's on every rank")
    assert "all-reduce this gradient over the ranks after backward" in found.suggestion


def _reduced(ranges: dict[int, tuple[int, int]]) -> Kit:
    """Each rank all-reduces (line 42) its partial sum `ranges[r]` of `y` and returns the sum."""
    kit = _kit()
    for r, rank in kit.each_rank():
        kit.psum("y", f"rank{r}/y", *ranges[r], 16)
        rank.all_reduce("total", "y", out=SHAPE, line=42)
        rank.graph.outputs[0] = "total"
    return kit


def test_an_all_reduce_of_partial_sums_that_do_not_tile_is_a_wrong_shard() -> None:
    found = output_mismatch(_reduced({0: (0, 8), 1: (0, 8)}).context(), [0])
    assert found.kind == "wrong-shard" and at(found) == (PARALLEL_FILE, RETURNED)
    assert "rank 0 and rank 1 both sum [0:8] (rank 0: [0:8], rank 1: [0:8] of 16)" in found.message


def test_near_misses_claim_no_kind_their_numbers_do_not_show() -> None:
    kit = _kit()  # the same shape, nothing related: no layout, no order, no reduction to blame
    found = output_mismatch(kit.context(), [0])
    assert found.kind == "not-equivalent" and found.found == "values unrelated to the reference output"
    tiled = output_mismatch(_reduced({0: (0, 8), 1: (8, 16)}).context(), [0])
    assert tiled.kind != "wrong-shard"
