"""skipped-operation: every rank computes the reference right up to one operation and then uses
or returns that operation's input in its place (a residual add, a bias, an activation left out).
Reported where the rank returns the input, where it applies the next operation to it, or, when
the reference makes the input and the operation in one call (a linear and its bias), at the
rank's call that makes the input. A selection left out (a shard question) is not this mistake."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, Kit, Program, at

from shardproof.localize.detectors.skipped_operation import skipped_operation

SHAPE = (2, 8, 16)


def _block(kit: Kit) -> None:
    """The reference: `lin = linear(x, w)` and `lb = lin + b` (one call, line 10), `y = x + lb`
    (line 11), returned."""
    kit.input("x", *SHAPE)
    kit.ref.parameter("w", "down.weight", 16, 16)
    kit.ref.parameter("b", "down.bias", 16)
    kit.ref.op("lin", "linear", "x", "w", out=SHAPE, line=10, module="down")
    kit.ref.op("lb", "binary", "lin", "b", out=SHAPE, line=10, module="down", fn="add")
    kit.ref.op("y", "binary", "x", "lb", out=SHAPE, line=11, fn="add")
    kit.ref.output("y")
    for r, rank in kit.each_rank():
        rank.parameter("w", "down.weight", 16, 16)
        rank.parameter("b", "down.bias", 16)
        kit.equal("w", f"rank{r}/w")
        kit.equal("b", f"rank{r}/b")


def _find(steps, ref_value: str, equal: tuple[str, ...] = ("lin",)):
    """The detector at `ref_value` on rank 0, every rank running `steps(rank)` after the reference
    of `_block`; the rank values named in `equal` are the reference's values of that name."""
    kit = Kit()
    _block(kit)
    for r, rank in kit.each_rank():
        steps(rank)
        for name in equal:
            kit.equal(name, f"rank{r}/{name}")
    ctx = kit.context()
    return skipped_operation(ctx, ctx.ref_nodes[ref_value], 0)


def test_a_residual_left_out_is_reported_where_the_rank_returns_the_value() -> None:
    def steps(rank: Program) -> None:
        rank.op("lin", "linear", "x", "w", out=SHAPE, line=40)
        rank.op("lb", "binary", "lin", "b", out=SHAPE, line=41, fn="add")
        rank.output("lb")

    found = _find(steps, "y", equal=("lin", "lb"))
    assert found is not None and found.kind == "skipped-operation"
    assert at(found) == (PARALLEL_FILE, 41)
    assert found.message == (
        "rank 0 returns the output of add in down, where the reference returns the add of it and input 0 of "
        "the forward: the add is left out"
    )


def test_a_bias_left_out_is_reported_where_the_next_operation_reads_the_value_in_either_order() -> None:
    def steps(rank: Program) -> None:
        rank.op("partial", "linear", "x", "w", out=SHAPE, line=40)
        rank.all_reduce("lin", "partial", out=SHAPE, line=41)
        rank.op("y", "binary", "lin", "x", out=SHAPE, line=42, fn="add")  # the operands swapped
        rank.output("y")

    found = _find(steps, "lb")
    assert found is not None and at(found) == (PARALLEL_FILE, 42)
    assert found.message.startswith("rank 0 applies the add to the output of linear down, where the reference")


def test_a_bias_the_rank_s_own_linear_leaves_out_is_reported_at_that_linear() -> None:
    def steps(rank: Program) -> None:
        rank.op("lin", "linear", "x", "w", out=SHAPE, line=40)
        rank.op("y", "binary", "x", "lin", out=SHAPE, line=42, fn="add")
        rank.output("y")

    found = _find(steps, "lb")
    assert found is not None and at(found) == (PARALLEL_FILE, 40)
    assert "with its linear, where the reference's call also applies the add" in found.message


def test_a_selection_left_out_is_not_a_skipped_operation() -> None:
    kit = Kit()
    kit.input("x", *SHAPE)
    kit.ref.op("gate", "slice", "x", out=(2, 8, 8), line=10, dim=-1, start=0, end=8)
    kit.ref.op("y", "unary", "gate", out=(2, 8, 8), line=11, fn="silu")
    kit.ref.output("y")
    for r, rank in kit.each_rank():
        rank.op("gate", "slice", "x", out=(2, 8, 8), line=40, dim=-1, start=8, end=16)
        rank.op("y", "unary", "gate", out=(2, 8, 8), line=41, fn="silu")
        rank.output("y")
        kit.sel("x", f"rank{r}/gate", -1, (8, 16))
    ctx = kit.context()
    assert skipped_operation(ctx, ctx.ref_nodes["gate"], 0) is None
