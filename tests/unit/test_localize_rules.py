"""Two localizer rules on hand-built evidence (graphs and the relations saturation would prove):

- wrong-collective-op: a reducing collective (all-reduce or reduce-scatter) whose inputs are the
  ranks' partial sums, read directly or rearranged alike on every rank by index maps, combined
  with another op than SUM, is the finding; SUM, ranks rearranging differently, or a reduction
  whose result is already related are not.
- a fused value cut as one block: the reference splits a value into parts (slices, or a view's
  leading factor) and the rank splits its one contiguous block of the fused dim into as many."""

from __future__ import annotations

from shardproof.graph.model import Collective, Frame, Graph, Node, Placeholder, SourceSite, TensorMeta
from shardproof.localize.context import Context
from shardproof.localize.detectors.collective_op import wrong_collective_op
from shardproof.localize.evidence import Evidence
from shardproof.localize.fused_parts import OneBlockOfParts, _leading_factor, cut_by_the_user, one_block_of_parts
from shardproof.relations import expr as px
from shardproof.verify.engine import Facts
from shardproof.verify.relations_found import RelationIndex

F32 = "float32"


def _meta(*shape: int) -> TensorMeta:
    return TensorMeta(tuple(shape), F32)


def _context(reference: Graph, ranks: list[Graph], facts: Facts) -> Context:
    index = RelationIndex(reference, ranks, facts)
    return Context(Evidence(reference, ranks, [{} for _ in ranks], index, []))


# ------------------------------------------------------------------------- wrong-collective-op


def _scattered(op: str, permutes: list[list[int]], output_related: bool = False) -> Context:
    """Each rank: partial sums of the reference's [2, 8, 16] `down`, permuted by its own dims,
    reduce-scattered over ranks 0 and 1 with `op`."""
    reference = Graph("reference", None, 1, [Placeholder("x", "input", "0", _meta(2, 8, 16))], [], ["down"])
    reference.nodes.append(Node("down", "linear", ("x",), {}, _meta(2, 8, 16)))
    ranks = []
    facts = Facts(classes={"reference/x": 0, "reference/down": 1})
    for rank, dims in enumerate(permutes):
        name = f"rank{rank}"
        nodes = [
            Node("down", "linear", ("x",), {}, _meta(2, 8, 16)),
            Node("moved", "permute", ("down",), {"dims": dims}, _meta(8, 2, 16)),
            Node(
                "scattered",
                "reduce_scatter",
                ("moved",),
                {},
                _meta(4, 2, 16),
                collective=Collective("reduce_scatter", op, (0, 1)),
            ),
        ]
        ranks.append(Graph(name, rank, 2, [Placeholder("x", "input", "0", _meta(2, 8, 16))], nodes, ["scattered"]))
        part = 10 + 10 * rank
        facts.classes.update({f"{name}/x": 0, f"{name}/down": part, f"{name}/moved": part + 1})
        facts.classes[f"{name}/scattered"] = part + 2
        facts.psum.append((1, part, 8 * rank, 8 * rank + 8, 16))
        if output_related:
            facts.sel.append((1, part + 2, 1, ((4 * rank, 4 * rank + 4),)))
    return _context(reference, ranks, facts)


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


def _slice(name: str, source: str, start: int, end: int) -> Node:
    return Node(name, "slice", (source,), {"dim": -1, "start": start, "end": end}, _meta(2, 8, end - start))


def _fused_split(rank_ranges: list[tuple[tuple[int, int], ...]], rank_parts: int = 3) -> Context:
    """The reference splits a [2, 8, 32] fused output into q [0:16], k [16:24], v [24:32]; each rank
    holds `rank_ranges` of it (16 columns) and slices it into `rank_parts` parts."""
    ref_nodes = [Node("fused", "linear", ("x",), {}, _meta(2, 8, 32))]
    for i, (start, end) in enumerate([(0, 16), (16, 24), (24, 32)]):
        ref_nodes.append(_slice(f"split.{i}", "fused", start, end))
    x = Placeholder("x", "input", "0", _meta(2, 8, 16))
    reference = Graph("reference", None, 1, [x], ref_nodes, ["split.0"])
    facts = Facts(classes={"reference/x": 0, "reference/fused": 1})
    local = [(0, 8), (8, 12), (12, 16)][:rank_parts]
    ranks = []
    for rank, ranges in enumerate(rank_ranges):
        nodes = [Node("fused", "linear", ("x",), {}, _meta(2, 8, 16))]
        for i, (start, end) in enumerate(local):
            nodes.append(_slice(f"split.{i}", "fused", start, end))
        ranks.append(Graph(f"rank{rank}", rank, 2, [x], nodes, ["split.0"]))
        facts.classes.update({f"rank{rank}/x": 0, f"rank{rank}/fused": 10 + rank})
        facts.sel.append((1, 10 + rank, -1, ranges))
    return _context(reference, ranks, facts)


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
    x = Placeholder("x", "input", "0", _meta(2, 8, 16))
    reference = Graph(
        "reference",
        None,
        1,
        [x],
        [
            Node("fused", "linear", ("x",), {}, _meta(2, 8, 48)),
            Node("heads", "view", ("fused",), {"shape": [2, 8, 3, 4, 4]}, _meta(2, 8, 3, 4, 4)),
        ],
        ["heads"],
    )
    facts = Facts(classes={"reference/x": 0, "reference/fused": 1})
    ranks = []
    for rank in range(2):
        nodes = [
            Node("fused", "linear", ("x",), {}, _meta(2, 8, 24)),
            Node("heads", "view", ("fused",), {"shape": [2, 8, 3, 2, 4]}, _meta(2, 8, 3, 2, 4)),
        ]
        ranks.append(Graph(f"rank{rank}", rank, 2, [x], nodes, ["heads"]))
        facts.classes.update({f"rank{rank}/x": 0, f"rank{rank}/fused": 10 + rank})
        facts.sel.append((1, 10 + rank, -1, ((24 * rank, 24 * rank + 24),)))
    ctx = _context(reference, ranks, facts)
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
