"""The rank op playing a broken value's part with an input that is unrelated or does not fit its
partners (detectors/mismatch.py): reported where that input's wrongness was introduced (a slice
every rank takes alike, one that differs between ranks, a value unrelated to the reference, a
gather of a value already whole), with the relation the message names matching the evidence. An
op whose inputs are right, or no op playing the part, is not this mistake; an op no rule follows
on sharded inputs is unsupported."""

from __future__ import annotations

from collections.abc import Callable

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, Program, at

from shardproof.localize.detectors.mismatch import mismatch
from shardproof.results import Discrepancy, Unsupported

SHAPE = (2, 8, 16)
WHOLE, CUT, USE = 40, 41, 42  # parallel.py: `full = up(x)`, `part = full[..., s:e]`, `down(part)`


def _kit(
    cuts: dict[int, tuple[int, int]] | None = None, *, feed: Callable[[Kit, int, Program], str] | None = None
) -> Kit:
    """The reference: `h = up(x)` (line 10), `y = down(h)` (line 11, down's weight [16, 16]). Rank r
    computes `up` whole (line 40), cuts `cuts[r]` of its last dim (line 41, by default block r) and
    applies its block r of down's input features (line 42) to the cut, or to what `feed` adds."""
    kit = Kit()
    kit.input("x", *SHAPE)
    kit.ref.parameter("w", "mlp.down.weight", 16, 16)
    kit.ref.op("h", "linear", "x", out=SHAPE, line=10, module="mlp.up")
    kit.ref.op("y", "linear", "h", "w", out=SHAPE, line=11, module="mlp.down")
    kit.ref.output("y")
    for r, rank in kit.each_rank():
        start, end = (cuts or {}).get(r, (8 * r, 8 * r + 8))
        rank.parameter("w", "mlp.down.weight", 16, 8)
        kit.sel("w", f"rank{r}/w", -1, (8 * r, 8 * r + 8))
        rank.op("full", "linear", "x", out=SHAPE, line=WHOLE, module="mlp.up")
        kit.equal("h", f"rank{r}/full")
        rank.op("part", "slice", "full", out=(2, 8, end - start), line=CUT, dim=-1, start=start, end=end)
        kit.sel("h", f"rank{r}/part", -1, (start, end))
        fed = feed(kit, r, rank) if feed is not None else "part"
        rank.op("y", "linear", fed, "w", out=SHAPE, line=USE, module="mlp.down")
        rank.output("y")
    return kit


def _check(kit: Kit, rank: int = 1, ref_value: str = "y") -> Discrepancy | Unsupported | None:
    ctx = kit.context()
    return mismatch(ctx, ctx.ref_nodes[ref_value], rank)


def test_a_rank_cutting_another_ranks_block_is_reported_at_its_cut() -> None:
    found = _check(_kit({1: (0, 8)}))
    assert isinstance(found, Discrepancy) and found.kind == "wrong-shard"
    assert at(found) == (PARALLEL_FILE, CUT)
    assert found.message == (
        "rank 1 applies the linear mlp.down at parallel.py:42:5 to the slice [0:8] of dim 2 (size 16) of the "
        "output of linear mlp.up, where the reference uses the output of linear mlp.up"
    )
    assert found.found == "the slice [0:8] of dim 2 (size 16) of the output of linear mlp.up"
    assert found.expected == "input 0 of the linear mlp.down holds part of the output of linear mlp.up"
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 11)
    assert [s.line for s in found.related] == [USE]
    assert found.details["wrong_inputs"] == [0] and found.parallel_nodes == ["rank1/y", "rank1/part"]


def test_a_cut_that_differs_between_ranks_out_of_order_is_reported_at_the_cut() -> None:
    found = _check(_kit({0: (8, 16), 1: (0, 8)}))
    assert isinstance(found, Discrepancy) and found.kind == "wrong-shard"
    assert at(found) == (PARALLEL_FILE, CUT) and found.primary.note == "this slice differs between ranks"
    assert found.details["blame"] == "rank-dependent-slice"


def test_an_input_unrelated_to_the_reference_is_reported_where_it_is_made() -> None:
    def noise(kit: Kit, r: int, rank: Program) -> str:
        if r == 0:
            return "part"
        rank.op("noise", "uninitialized", out=(2, 8, 8), line=39)
        kit.cls("rank1/noise")
        return "noise"

    found = _check(_kit(feed=noise))
    assert isinstance(found, Discrepancy) and found.kind == "not-equivalent"
    assert at(found) == (PARALLEL_FILE, 39)
    assert "to a value unrelated to anything the reference computes" in found.message
    assert found.found == "a value unrelated to anything the reference computes"


def test_a_gather_of_a_value_already_whole_says_so() -> None:
    def gathered(kit: Kit, r: int, rank: Program) -> str:
        rank.op("gathered", "all_gather", "full", out=(4, 8, 16), line=39)
        kit.cls(f"rank{r}/gathered")
        return "gathered"

    found = _check(_kit(feed=gathered))
    assert isinstance(found, Discrepancy) and at(found) == (PARALLEL_FILE, 39)
    assert "it is the all-gather of a value every rank already holds in full" in found.message
    assert found.details["blame"] == "gather-of-whole" and "scatter the value" in found.suggestion


def test_blocks_added_by_an_all_reduce_are_reported_at_the_all_reduce() -> None:
    def summed(kit: Kit, r: int, rank: Program) -> str:
        rank.all_reduce("summed", "part", out=(2, 8, 8), line=39)
        kit.cls(f"rank{r}/summed")
        return "summed"

    found = _check(_kit(feed=summed))
    assert isinstance(found, Discrepancy) and found.kind == "wrong-layout"
    assert at(found) == (PARALLEL_FILE, 39) and found.details["blame"] == "reduced-blocks"
    assert "the all-reduce before it adds the ranks' blocks of a value" in found.message
    assert "reduce partial sums, not blocks" in found.suggestion


def test_an_op_no_rule_follows_on_sharded_inputs_is_unsupported() -> None:
    kit = _kit()
    kit.ref.op("z", "generic", "h", out=SHAPE, line=12, target="aten::no_such_op")
    for _, rank in kit.each_rank():
        rank.op("z", "generic", "part", out=(2, 8, 8), line=43, target="aten::no_such_op")
    found = _check(kit, ref_value="z")
    assert isinstance(found, Unsupported) and found.reason == "unsupported-op"
    assert found.op == "no_such_op" and found.site is not None and found.site.file == REFERENCE_FILE


def test_an_op_whose_inputs_are_whole_is_not_this_mistake() -> None:
    kit = _kit({1: (0, 8)})
    kit.ref.op("z", "unary", "h", out=SHAPE, line=12, fn="relu")
    for _, rank in kit.each_rank():
        rank.op("z", "unary", "full", out=SHAPE, line=43, fn="relu")
    assert _check(kit, ref_value="z") is None


def test_no_op_playing_the_part_is_not_this_mistake() -> None:
    kit = _kit({1: (0, 8)})
    kit.ref.op("z", "softmax", "x", out=SHAPE, line=12, dim=-1)
    assert _check(kit, ref_value="z") is None


def test_two_reference_values_described_alike_are_told_apart_by_their_lines() -> None:
    """The reference negates two masks (lines 10 and 11) and uses the second; each rank uses the
    first: both are `the output of logical_not`, so the message names their lines."""
    kit = Kit()
    kit.input("m", *SHAPE)
    kit.input("n", *SHAPE, target="1")
    kit.ref.op("a", "unary", "m", out=SHAPE, line=10, fn="logical_not")
    kit.ref.op("b", "unary", "n", out=SHAPE, line=11, fn="logical_not")
    kit.ref.op("y", "binary", "b", "m", out=SHAPE, line=12, fn="mul")
    kit.ref.output("y")
    for r, rank in kit.each_rank():
        rank.op("a", "unary", "m", out=SHAPE, line=40, fn="logical_not")
        kit.equal("a", f"rank{r}/a")
        rank.op("y", "binary", "a", "m", out=SHAPE, line=41, fn="mul")
        rank.output("y")
    found = _check(kit, rank=0)
    assert isinstance(found, Discrepancy)
    assert found.message.endswith(
        "to the output of logical_not (at reference.py:10:5), where the reference uses the output of logical_not "
        "(at reference.py:11:5)"
    ), found.message
