"""A partial sum used before its reduction (detectors/partial_misuse.py), at the reference value
that reads it: where the fix belongs for each way of misusing it, with the ranges and counts the
message prints matching the evidence. Inputs that are no partial sums on the rank, or partial
sums the rank does not use, are not this mistake; neither is an all-reduce whose partial sums
tile the reduction."""

from __future__ import annotations

from evidence_kit import PARALLEL_FILE, REFERENCE_FILE, Kit, at, frame

from shardproof.graph.model import Collective
from shardproof.localize.detectors.partial_misuse import partial_misuse

SHAPE = (2, 8, 16)
PRODUCED, USED, REDUCED = 40, 41, 42  # parallel.py: the partial sum, its use, the all-reduce


def _kit(world_size: int = 2, *, ranges: dict[int, tuple[int, int]] | None = None, maxima: bool = False) -> Kit:
    """The reference's `h = down(x)` (line 10); every rank computes (line 40) the partial sum (or
    with `maxima` the partial max) of `h` over its block of the 16 input features (`ranges`)."""
    kit = Kit(world_size)
    kit.input("x", *SHAPE)
    kit.ref.op("h", "linear", "x", out=SHAPE, line=10, module="mlp.down")
    block = 16 // world_size
    for r, rank in kit.each_rank():
        rank.op("h", "linear", "x", out=SHAPE, line=PRODUCED, module="mlp.down")
        start, end = (ranges or {}).get(r, (r * block, r * block + block))
        (kit.pmax if maxima else kit.psum)("h", f"rank{r}/h", start, end, 16)
    return kit


def _early_and_again(kit: Kit) -> Kit:
    """`y = h + g`: both partial sums, meant to be all-reduced together; each rank reduces `g` on
    its own first (line 39), through the same helper (line 60) that then reduces `y` (line 42)."""
    kit.ref.op("g", "linear", "x", out=SHAPE, line=9, module="mlp.other")
    kit.ref.op("y", "binary", "h", "g", out=SHAPE, line=11, fn="add")
    helper = frame(60, function="reduce_from_tp")
    for r, rank in kit.each_rank():
        pair = _pair(kit, r)
        group = Collective("all_reduce", "sum", pair)
        block, position = 16 // len(pair), pair.index(r)
        rank.op("g", "linear", "x", out=SHAPE, line=38, module="mlp.other")
        kit.psum("g", f"rank{r}/g", block * position, block * position + block, 16)
        rank.op("early", "all_reduce", "g", out=SHAPE, frames=(frame(39), helper), collective=group)
        kit.equal("g", f"rank{r}/early")
        rank.op("y", "binary", "h", "early", out=SHAPE, line=USED, fn="add")
        rank.op("total", "all_reduce", "y", out=SHAPE, frames=(frame(REDUCED), helper), collective=group)
    return kit


def _check(kit: Kit, rank: int = 1, ref_value: str = "y"):
    ctx = kit.context()
    return partial_misuse(ctx, ctx.ref_nodes[ref_value], rank)


def _everywhere(kit: Kit, *ops: tuple) -> None:
    """The same ops on the reference (lines from 11) and on every rank (lines from 41)."""
    for program in kit.programs:
        for i, (value, op, inputs, attrs) in enumerate(ops):
            line = (11 if program.graph.rank is None else USED) + i
            program.op(value, op, *inputs, out=SHAPE, line=line, **attrs)


# -- missing-reduction and partial-sum-into-nonlinear ----------------------------------------------


def test_a_partial_sum_added_without_an_all_reduce_is_reported_where_it_is_produced() -> None:
    kit = _kit()
    _everywhere(kit, ("y", "binary", ("h", "x"), {"fn": "add"}))
    found = _check(kit)
    assert found is not None and found.kind == "missing-reduction"
    assert at(found) == (PARALLEL_FILE, PRODUCED) and found.primary.note == "the partial sum is produced here"
    assert (
        found.message
        == "the partial sum of the linear mlp.down reaches the add at parallel.py:41:5 without an all-reduce"
    )
    assert found.found == "rank 1 holds a partial sum over its input features [8:16] of 16"
    assert found.expected == "the output of linear mlp.down in full on every rank (replicated), as input 0 of the add"
    assert found.details["holdings"] == {
        "0": "a partial sum over [0:8] of the 16 input features",
        "1": "a partial sum over [8:16] of the 16 input features",
    }
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 11)
    assert "all-reduce the partial sums" in found.suggestion


def test_partial_maxima_need_an_all_reduce_with_max() -> None:
    kit = _kit(maxima=True)
    _everywhere(kit, ("y", "unary", ("h",), {"fn": "relu"}))
    found = _check(kit)
    assert found is not None and found.kind == "missing-reduction"
    assert found.message.endswith("without an all-reduce (max)") and "op=MAX" in found.suggestion
    assert found.found == "rank 1 holds a partial max over its input features [8:16] of 16"


def test_a_partial_sum_into_a_nonlinear_op_with_no_reduction_after_is_reported_where_produced() -> None:
    kit = _kit()
    _everywhere(kit, ("y", "unary", ("h",), {"fn": "relu"}))
    found = _check(kit)
    assert found is not None and found.kind == "partial-sum-into-nonlinear"
    assert at(found) == (PARALLEL_FILE, PRODUCED)
    assert "reaches the relu at parallel.py:41:5 without an all-reduce" in found.message


def test_a_nonlinear_op_applied_before_the_all_reduce_is_reported_at_that_op() -> None:
    kit = _kit()
    _everywhere(kit, ("y", "unary", ("h",), {"fn": "relu"}))
    for _, rank in kit.each_rank():
        rank.all_reduce("total", "y", out=SHAPE, line=REDUCED)
    found = _check(kit)
    assert found is not None and found.kind == "partial-sum-into-nonlinear"
    assert at(found) == (PARALLEL_FILE, USED)
    assert found.message == (
        "the relu is applied to the partial sum of the output of linear mlp.down before the all-reduce at "
        "parallel.py:42:5; it needs the full value"
    )
    assert [s.line for s in found.related] == [REDUCED, PRODUCED]
    assert "move the all-reduce before this line" in found.suggestion


# -- a bias, a share, a second reduction, a rearrangement -------------------------------------------


def _tensor_parallel_pairs() -> Kit:
    """Four ranks, two data-parallel copies of a tensor-parallel pair: (0, 1) and (2, 3)."""
    return _kit(4, ranges={0: (0, 8), 1: (8, 16), 2: (0, 8), 3: (8, 16)})


def _pair(kit: Kit, rank: int) -> tuple[int, ...]:
    """The tensor-parallel group of `rank`: all ranks, or its pair when there are four."""
    return (rank - rank % 2, rank - rank % 2 + 1) if len(kit.ranks) == 4 else tuple(range(len(kit.ranks)))


def _with_bias(kit: Kit, share: tuple[int, int] | None = None) -> None:
    """`y = h + b` on every program, a rank adding `b` whole, or `share` = (num, den) of it
    (computed at line 39), then all-reducing `y` over its tensor-parallel group at line 42."""
    kit.ref.parameter("b", "mlp.down.bias", 16)
    kit.ref.op("y", "binary", "h", "b", out=SHAPE, line=11, fn="add")
    for r, rank in kit.each_rank():
        rank.parameter("b", "mlp.down.bias", 16)
        kit.equal("b", f"rank{r}/b")
        added = "b"
        if share is not None:
            rank.op("share", "scalar", "b", out=(16,), line=39, fn="mul", value=share[0] / share[1])
            kit.frac("b", f"rank{r}/share", *share)
            added = "share"
        rank.op("y", "binary", "h", added, out=SHAPE, line=USED, fn="add")
        rank.all_reduce("total", "y", out=SHAPE, line=REDUCED, group=_pair(kit, r))


def test_a_bias_added_before_the_all_reduce_is_reported_at_the_addition() -> None:
    kit = _kit()
    _with_bias(kit)
    found = _check(kit)
    assert found is not None and found.kind == "bias-before-reduction"
    assert at(found) == (PARALLEL_FILE, USED)
    assert found.message == (
        "mlp.down.bias is added to a partial sum on every rank before the all-reduce, so it is counted 2 times"
    )
    assert [s.line for s in found.related] == [REDUCED]
    assert found.expected == "mlp.down.bias added once, after the all-reduce"


def test_a_bias_added_before_a_pairs_all_reduce_is_counted_by_the_pair() -> None:
    kit = _tensor_parallel_pairs()
    _with_bias(kit)
    found = _check(kit)
    assert found is not None and found.kind == "bias-before-reduction"
    assert found.message.endswith("so it is counted 2 times")


def test_a_share_of_the_bias_with_the_wrong_fraction_is_reported_where_the_share_is_computed() -> None:
    kit = _kit()
    _with_bias(kit, share=(1, 4))
    found = _check(kit)
    assert found is not None and found.kind == "wrong-scaling"
    assert at(found) == (PARALLEL_FILE, 39)
    assert "adds 1/4 of mlp.down.bias to a partial sum over 8/16 of the reduction" in found.message
    counted = found.message.split("counts ")[1].split(" times")[0]
    numerator, denominator = map(int, counted.split("/"))
    assert numerator / denominator == 2 * (1 / 4)  # two ranks each add a quarter
    assert found.expected == "a 8/16 share of the bias on each rank" and found.found == "a 1/4 share"


def test_a_share_with_the_right_fraction_is_not_wrongly_scaled() -> None:
    kit = _kit()
    _with_bias(kit, share=(1, 2))
    found = _check(kit)
    assert found is None or found.kind != "wrong-scaling"


def test_a_partial_sum_reduced_early_and_again_with_another_is_reported_at_the_early_reduction() -> None:
    found = _check(_early_and_again(_kit()))
    assert found is not None and found.kind == "duplicate-reduction"
    assert at(found) == (PARALLEL_FILE, 39)
    assert "all-reduced again with it, so it counts 2 times" in found.message
    joins, again = found.related
    assert (joins.line, joins.note) == (USED, "where the reduced value joins the partial sum")
    assert again.note == "the all-reduce that reduces it again"


def test_a_value_reduced_twice_in_a_pair_counts_the_pair() -> None:
    found = _check(_early_and_again(_tensor_parallel_pairs()))
    assert found is not None and found.kind == "duplicate-reduction"
    assert "so it counts 2 times" in found.message


def test_partial_sums_rearranged_before_a_reduce_scatter_are_reported_at_the_rearrangement() -> None:
    kit = _kit()
    kit.ref.op("y", "unary", "h", out=SHAPE, line=11, fn="relu")
    for _, rank in kit.each_rank():
        rank.op("moved", "permute", "h", out=(8, 2, 16), line=USED, dims=[1, 0, 2])
        scatter = Collective("reduce_scatter", "sum", (0, 1))
        rank.op("scattered", "reduce_scatter", "moved", out=(4, 2, 16), line=REDUCED, collective=scatter)
    found = _check(kit)
    assert found is not None and found.kind == "wrong-layout"
    assert at(found) == (PARALLEL_FILE, USED)
    assert found.message == (
        "the partial sums are rearranged by the transpose at parallel.py:41:5 before the reduce-scatter, into a "
        "layout that does not match the reference's value"
    )


# -- an all-reduce of partial sums that do not tile (reduction_coverage.py) -------------------------


def _reduced(kit: Kit, group: tuple[int, ...] | None = None) -> Kit:
    kit.ref.op("y", "unary", "h", out=SHAPE, line=11, fn="relu")
    for _, rank in kit.each_rank():
        rank.all_reduce("total", "h", out=SHAPE, line=REDUCED, group=group or ())
        rank.op("y", "unary", "total", out=SHAPE, line=43, fn="relu")
    return kit


def test_two_ranks_summing_the_same_part_are_reported_where_the_second_ones_part_is_made() -> None:
    found = _check(_reduced(_kit(ranges={1: (0, 8)})))
    assert found is not None and found.kind == "wrong-shard"
    assert at(found) == (PARALLEL_FILE, PRODUCED) and found.ranks == [1]
    assert found.message == (
        "the all-reduce at parallel.py:42:5 sums partial results that do not tile the reduction: rank 0 and rank 1 "
        "both sum [0:8] (rank 0: [0:8], rank 1: [0:8] of 16)"
    )


def test_an_all_reduce_over_the_wrong_group_is_reported_at_the_all_reduce() -> None:
    """Four ranks in tensor-parallel pairs (0, 1) and (2, 3); the all-reduce runs over (0, 2)."""
    kit = _kit(4, ranges={0: (0, 8), 1: (8, 16), 2: (0, 8), 3: (8, 16)})
    found = _check(_reduced(kit, group=(0, 2)), rank=0)
    assert found is not None and found.kind == "wrong-group"
    assert at(found) == (PARALLEL_FILE, REDUCED)
    assert "runs over ranks [0, 2]" in found.message and "ranks [0, 1] hold the parts that do" in found.message
    assert "rank 0 and rank 2 both sum [0:8]" in found.message


def test_an_all_reduce_of_partial_sums_that_tile_is_no_finding() -> None:
    assert _check(_reduced(_kit())) is None
    assert _check(_reduced(_kit(ranges={0: (8, 16), 1: (0, 8)}))) is None  # in any rank order


# -- not this mistake ------------------------------------------------------------------------------


def test_an_input_the_rank_holds_whole_is_no_partial_sum() -> None:
    kit = _kit()
    _everywhere(kit, ("y", "unary", ("x",), {"fn": "relu"}))
    assert _check(kit) is None


def test_a_partial_sum_the_rank_does_not_use_is_not_misused() -> None:
    kit = _kit()
    kit.ref.op("y", "unary", "h", out=SHAPE, line=11, fn="relu")
    for _, rank in kit.each_rank():
        rank.op("y", "unary", "x", out=SHAPE, line=USED, fn="relu")
    assert _check(kit) is None
