"""not-equivalent, the last resort at a broken value: the rank computes nothing related to it. The
report names the value and goes to the rank op playing its part (none when the rank has no such
op); an op no rule follows on sharded inputs makes the result unsupported instead."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at

from shardproof.localize.detectors.not_equivalent import not_equivalent
from shardproof.results import Discrepancy, Unsupported

SHAPE = (2, 8, 16)


def _kit(op: str = "unary", rank_op: str | None = "unary", **attrs: object) -> Kit:
    """The reference: `y = op(h)` (line 11) of `h = up(x)` (line 10); each rank holds block r of
    `h` (line 40) and applies `rank_op` to it (line 41), a value nothing relates to `y`."""
    kit = Kit()
    kit.input("x", *SHAPE)
    kit.ref.op("h", "linear", "x", out=SHAPE, line=10, module="mlp.up")
    kit.ref.op("y", op, "h", out=SHAPE, line=11, **attrs)
    for r, rank in kit.each_rank():
        rank.op("h", "linear", "x", out=(2, 8, 8), line=40, module="mlp.up")
        kit.sel("h", f"rank{r}/h", -1, (8 * r, 8 * r + 8))
        if rank_op is not None:
            rank.op("y", rank_op, "h", out=(2, 8, 8), line=41, **attrs)
    return kit


def _check(kit: Kit) -> Discrepancy | Unsupported:
    ctx = kit.context()
    return not_equivalent(ctx, ctx.ref_nodes["y"], 1, [1])


def test_a_value_nothing_on_the_rank_relates_to_is_reported_at_the_op_playing_its_part() -> None:
    found = _check(_kit(fn="relu"))
    assert isinstance(found, Discrepancy) and found.kind == "not-equivalent"
    assert at(found) == (PARALLEL_FILE, 41)
    assert found.message == "rank 1 computes nothing equal or related to the output of relu"
    assert found.expected == "a value related to the output of relu" and found.found == "no related value"
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 11)
    assert found.ranks == [1] and found.parallel_nodes == ["rank1/y"]


def test_a_rank_with_no_op_playing_the_part_has_no_site() -> None:
    found = _check(_kit(rank_op=None, fn="relu"))
    assert isinstance(found, Discrepancy) and found.kind == "not-equivalent"
    assert found.primary is None and found.parallel_nodes == [] and "culprit" not in found.details


def test_an_op_no_rule_follows_on_sharded_inputs_is_unsupported_not_a_discrepancy() -> None:
    found = _check(_kit("generic", "generic", target="aten::no_such_op"))
    assert isinstance(found, Unsupported) and found.reason == "unsupported-op"
    assert found.op == "no_such_op"
    assert "no rule relates no_such_op on sharded or partial inputs" in found.message
