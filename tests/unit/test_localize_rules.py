"""Two localizer rules on hand-built evidence (graphs and the relations saturation would prove):

- wrong-collective-op: a reducing collective (all-reduce or reduce-scatter) whose inputs are the
  ranks' partial sums, read directly or rearranged alike on every rank by index maps, combined
  with another op than SUM, is the finding; SUM, ranks rearranging differently, or a reduction
  whose result is already related are not.
- a fused value cut as one block: the reference splits a value into parts (slices, or a view's
  leading factor) and the rank splits its one contiguous block of the fused dim into as many."""

from __future__ import annotations

from evidence_kit import F32, Kit

from shardproof.graph.model import Collective, Frame, SourceSite
from shardproof.localize.context import Context
from shardproof.localize.detectors.collective_op import wrong_collective_op
from shardproof.localize.fused_parts import OneBlockOfParts, _leading_factor, cut_by_the_user, one_block_of_parts
from shardproof.relations import expr as px

# ------------------------------------------------------------------------- wrong-collective-op


def _scattered(op: str, permutes: list[list[int]], output_related: bool = False) -> Context:
    """Each rank: partial sums of the reference's [2, 8, 16] `down`, permuted by its own dims,
    reduce-scattered over ranks 0 and 1 with `op`."""
    kit = Kit(len(permutes))
    kit.input("x", 2, 8, 16)
    kit.ref.op("down", "linear", "x", out=(2, 8, 16))
    kit.ref.output("down")
    for rank, program in kit.each_rank():
        program.op("down", "linear", "x", out=(2, 8, 16))
        program.op("moved", "permute", "down", out=(8, 2, 16), dims=permutes[rank])
        scatter = Collective("reduce_scatter", op, (0, 1))
        program.op("scattered", "reduce_scatter", "moved", out=(4, 2, 16), collective=scatter)
        program.output("scattered")
        kit.psum("down", f"rank{rank}/down", 8 * rank, 8 * rank + 8, 16)
        kit.cls(f"rank{rank}/moved")
        kit.cls(f"rank{rank}/scattered")
        if output_related:
            kit.sel("down", f"rank{rank}/scattered", 1, (4 * rank, 4 * rank + 4))
    return kit.context()


def test_a_reduce_scatter_of_rearranged_partial_sums_with_max_is_the_wrong_op() -> None:
    found = wrong_collective_op(_scattered("max", [[1, 0, 2], [1, 0, 2]]), [0])
    assert found is not None and found.kind == "wrong-collective-op"
    assert "reduce-scatter" in found.message and "op=MAX" in found.message
    assert "partial sums of the output of linear" in found.message and "rearranged by transpose" in found.message
    assert found.expected.startswith("op=SUM") and "ReduceOp.SUM" in found.suggestion
    assert found.parallel_nodes == ["rank0/scattered"] and found.ranks == [0, 1]


def test_avg_is_as_wrong_as_max_and_sum_is_right() -> None:
    assert wrong_collective_op(_scattered("avg", [[1, 0, 2], [1, 0, 2]]), [0]) is not None
    assert wrong_collective_op(_scattered("sum", [[1, 0, 2], [1, 0, 2]]), [0]) is None


def test_ranks_rearranging_their_parts_differently_do_not_combine_one_value() -> None:
    assert wrong_collective_op(_scattered("max", [[1, 0, 2], [0, 1, 2]]), [0]) is None


def test_a_reduction_whose_result_is_related_is_right_whatever_its_op() -> None:
    assert wrong_collective_op(_scattered("max", [[1, 0, 2], [1, 0, 2]], output_related=True), [0]) is None


# ------------------------------------------------------------------- fused value cut as one block


def _fused_split(rank_ranges: list[tuple[tuple[int, int], ...]], rank_parts: int = 3) -> Context:
    """The reference splits a [2, 8, 32] fused output into q [0:16], k [16:24], v [24:32]; each rank
    holds `rank_ranges` of it (16 columns) and slices it into `rank_parts` parts."""
    kit = Kit(len(rank_ranges))
    kit.input("x", 2, 8, 16)
    kit.ref.op("fused", "linear", "x", out=(2, 8, 32))
    for i, (start, end) in enumerate([(0, 16), (16, 24), (24, 32)]):
        kit.ref.op(f"split.{i}", "slice", "fused", out=(2, 8, end - start), dim=-1, start=start, end=end)
    kit.ref.output("split.0")
    kit.cls("fused")
    for rank, program in kit.each_rank():
        program.op("fused", "linear", "x", out=(2, 8, 16))
        for i, (start, end) in enumerate([(0, 8), (8, 12), (12, 16)][:rank_parts]):
            program.op(f"split.{i}", "slice", "fused", out=(2, 8, end - start), dim=-1, start=start, end=end)
        program.output("split.0")
        kit.sel("fused", f"rank{rank}/fused", -1, *rank_ranges[rank])
    return kit.context()


def _check(ctx: Context, rank: int) -> OneBlockOfParts | None:
    ref_node, aligned = ctx.ref_nodes["split.0"], ctx.rank_nodes[rank]["split.0"]
    return one_block_of_parts(ctx, ref_node, aligned, rank, "fused")


def test_one_block_of_a_fused_dim_split_into_parts_is_found() -> None:
    ctx = _fused_split([((0, 16),), ((16, 32),)])
    assert _check(ctx, 1) == OneBlockOfParts(dim=2, block=(16, 32), parts=((0, 16), (16, 24), (24, 32)))


def test_a_block_of_every_part_is_not_one_block() -> None:
    ctx = _fused_split([((0, 8), (16, 20), (24, 28)), ((8, 16), (20, 24), (28, 32))])
    assert _check(ctx, 1) is None


def test_a_rank_that_does_not_split_its_block_into_the_parts_is_not_this_mistake() -> None:
    assert _check(_fused_split([((0, 16),), ((16, 32),)], rank_parts=2), 1) is None


def test_a_view_splits_a_dim_into_its_leading_factor() -> None:
    assert _leading_factor((2, 8, 48), (2, 8, 3, 4, 4)) == (2, 3)  # timm: [3, heads, head_dim]
    assert _leading_factor((2, 8, 48), (2, 8, 4, 3, 4)) == (2, 4)  # BLOOM: [heads, 3, head_dim]
    assert _leading_factor((2, 8, 48), (2, 8, 48, 1)) is None  # a unit dim added
    assert _leading_factor((2, 8, 48), (16, 48)) is None  # dims merged
    assert _leading_factor((2, 8, 48), (2, 8, 1, 48)) is None  # a factor of one: no parts
    assert _leading_factor((2, 8, 48), (2, 8, 3, 16, 1)) == (2, 3)


def test_one_block_viewed_into_parts_is_found() -> None:
    """The reference views its [2, 8, 48] fused output as [2, 8, 3, 4, 4]; rank 1 holds [24:48] and
    views it as [2, 8, 3, 2, 4]: its 'q' is the second half of the reference's k."""
    kit = Kit()
    kit.input("x", 2, 8, 16)
    for program, width, heads in [(kit.ref, 48, 4), *((rank, 24, 2) for _, rank in kit.each_rank())]:
        program.op("fused", "linear", "x", out=(2, 8, width))
        program.op("heads", "view", "fused", out=(2, 8, 3, heads, 4), shape=[2, 8, 3, heads, 4])
        program.output("heads")
    for rank, _ in kit.each_rank():
        kit.sel("fused", f"rank{rank}/fused", -1, (24 * rank, 24 * rank + 24))
    ctx = kit.context()
    found = one_block_of_parts(ctx, ctx.ref_nodes["heads"], ctx.rank_nodes[1]["heads"], 1, "fused")
    assert found == OneBlockOfParts(dim=2, block=(24, 48), parts=((0, 16), (16, 32), (32, 48)))


def test_only_a_cut_a_user_line_made_is_blamed_for_the_layout() -> None:
    """A block cut by the user's code is the user's to change; a block cut inside a library's
    loader, or sized by the same code at world size 1 (no line cut it), is a layout to follow."""
    user = Frame("model.py", 12, "__init__", "w.chunk(2)[rank]")
    library = Frame("site-packages/megatron/layers.py", 400, "__init__", library="megatron")

    def weight_cut(*frames: Frame) -> dict[str, px.Expr]:
        source = px.ParamRef(shape=(32, 16), dtype=F32, name="wqkv.weight")
        site = SourceSite(frames) if frames else None
        return {"wqkv.weight": px.SliceOf(shape=(16, 16), dtype=F32, source=source, dim=0, start=16, end=32, site=site)}

    ctx = _fused_split([((0, 16),), ((16, 32),)])
    for values, by_user in [(weight_cut(user), True), (weight_cut(user, library), False), (weight_cut(), False)]:
        ctx.ev.rank_values[1] = values
        assert cut_by_the_user(ctx, 1, frozenset({"wqkv.weight"})) is by_user
