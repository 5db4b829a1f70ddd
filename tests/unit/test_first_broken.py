"""The first broken value (localize/context.py `first_broken`): under expert parallelism a value
another rank computes by design is not broken on the ranks that leave it to that rank, so the
first value no rank computes is where the mistake is; a value the rank holding it does not combine
as the reference does (a fused weight cut as one block) stays broken."""

from __future__ import annotations

from evidence_kit import Kit

SHAPE = (2, 8, 16)


def _experts(*, gates_right: bool) -> Kit:
    """The reference: expert e's output `e{e}` (a linear of x, line 10 + e) times its gate `g{e}`
    (line 20 + e), the terms `t{e}` summed into `s1` then `s2`... Rank r runs expert r alone, its
    term all-reduced. With `gates_right` off, rank 1 gates its expert with gate 0."""
    kit = Kit()
    kit.input("x", *SHAPE)
    previous = None
    for e in range(2):
        kit.ref.op(f"g{e}", "scalar", "x", out=SHAPE, line=20 + e, fn="eq", value=e)
        kit.ref.op(f"e{e}", "linear", "x", out=SHAPE, line=10 + e, module=f"experts.{e}")
        kit.ref.op(f"t{e}", "binary", f"g{e}", f"e{e}", out=SHAPE, line=30 + e, fn="mul")
        if previous is not None:
            kit.ref.op("s", "binary", previous, f"t{e}", out=SHAPE, line=40, fn="add")
        previous = f"t{e}"
    kit.ref.output("s")
    for r, rank in kit.each_rank():
        gate = r if gates_right or r == 0 else 0
        rank.op("g", "scalar", "x", out=SHAPE, line=50, fn="eq", value=gate)
        rank.op("e", "linear", "x", out=SHAPE, line=51, module="experts.0")
        rank.op("t", "binary", "g", "e", out=SHAPE, line=52, fn="mul")
        rank.all_reduce("s", "t", out=SHAPE, line=53)
        rank.output("s")
        kit.equal(f"g{gate}", f"rank{r}/g")
        kit.equal(f"e{r}", f"rank{r}/e")
        if gate == r:
            kit.equal(f"t{r}", f"rank{r}/t")
        if gates_right:
            kit.equal("s", f"rank{r}/s")
    return kit


def test_a_value_another_rank_computes_by_design_is_not_broken_here() -> None:
    ctx = _experts(gates_right=False).context()
    # rank 1 does not compute expert 0 (rank 0 does, and gates and sums it): its first broken value
    # is gate 1, which no rank computes, not expert 0's output or term
    assert ctx.first_broken(1, ["s"]) == "g1"
    assert ctx._computed_elsewhere(1, {"e0", "t0", "g1", "t1", "s"}) == {"e0", "t0"}


def test_a_value_the_rank_holding_it_does_not_combine_right_stays_broken() -> None:
    kit = _experts(gates_right=False)
    # without rank 0 holding expert 0's term, expert 0 is combined nowhere: broken on rank 1 too
    kit.facts.classes.pop("rank0/t")
    kit.cls("rank0/t")
    ctx = kit.context()
    assert ctx._computed_elsewhere(1, {"e0", "t0", "g1", "t1", "s"}) == set()
