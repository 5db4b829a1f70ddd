"""wrong-shard of a vocabulary-parallel embedding: rank r holds embedding rows [start, end) and must
look up exactly the ids in that interval, shifted by start, the others masked. A comparison with
the wrong bound is reported at that comparison, a wrong shift at the masked ids; a mask and shift
that match the rows are no finding. Also the reading of masks (masks.mask_interval)."""

from __future__ import annotations

from evidence_kit import I64, PARALLEL_FILE, REFERENCE_FILE, Kit, Program, at

from shardproof.localize.detectors.embedding_mask import embedding_mask
from shardproof.localize.detectors.masks import mask_interval, zeroed_outside

VOCAB, WIDTH, ROWS = 16, 4, 8  # each of 2 ranks holds 8 rows
IDS = (2, 8)
# parallel.py: 40 `below = ids < start`, 41 `above = ids >= end`, 42 `outside = below | above`,
# 43 `local = ids - start`, 44 `local = local.masked_fill(outside, 0)`, 45 the lookup
BELOW, ABOVE, OUTSIDE, SHIFT, FILL, LOOKUP = 40, 41, 42, 43, 44, 45


def _masked_ids(rank: Program, low: int, high: int, shift: int, *, high_fn: str = "ge") -> None:
    """`fill(ids - shift, (ids < low) | (ids >= high))` (`high_fn` "gt": `ids > high`)."""
    rank.op("below", "scalar", "ids", out=IDS, dtype="bool", line=BELOW, fn="lt", value=low)
    rank.op("above", "scalar", "ids", out=IDS, dtype="bool", line=ABOVE, fn=high_fn, value=high)
    rank.op("outside", "binary", "below", "above", out=IDS, dtype="bool", line=OUTSIDE, fn="or")
    rank.op("shifted", "scalar", "ids", out=IDS, dtype=I64, line=SHIFT, fn="sub", value=shift)
    rank.op("local", "fill", "shifted", "outside", out=IDS, dtype=I64, line=FILL, value=0)


def _kit(masks: dict[int, tuple[int, int, int]] | None = None) -> Kit:
    """Rank r holds rows [8r, 8r + 8) of the reference's `wte.weight` and masks its ids as
    `masks[r]` = (low, high, shift) says (by default the right interval and shift)."""
    kit = Kit()
    kit.input("ids", *IDS, dtype=I64)
    kit.ref.parameter("w", "wte.weight", VOCAB, WIDTH)
    kit.ref.op("emb", "embedding", "w", "ids", out=(*IDS, WIDTH), line=10, module="wte")
    kit.ref.output("emb")
    for r, rank in kit.each_rank():
        rank.parameter("w", "wte.weight", ROWS, WIDTH)
        kit.sel("w", f"rank{r}/w", -2, (ROWS * r, ROWS * r + ROWS))
        low, high, shift = (masks or {}).get(r, (ROWS * r, ROWS * r + ROWS, ROWS * r))
        _masked_ids(rank, low, high, shift)
        rank.op("emb", "embedding", "w", "local", out=(*IDS, WIDTH), line=LOOKUP, module="wte")
        rank.output("emb")
    return kit


def _check(kit: Kit, rank: int = 1):
    ctx = kit.context()
    return embedding_mask(ctx, ctx.ref_nodes["emb"], rank)


def test_a_wrong_upper_bound_is_reported_at_its_comparison() -> None:
    found = _check(_kit({1: (8, 15, 8)}))
    assert found is not None and found.kind == "wrong-shard"
    assert at(found) == (PARALLEL_FILE, ABOVE)
    assert found.message == (
        "vocab-parallel embedding: the mask keeps token ids [8:15] but this rank holds embedding rows [8:16]"
    )
    assert found.expected == "rank 1 looks up exactly the ids in [8:16] and zeroes the rest"
    assert "(ids >= 8 and ids < 16)" in found.suggestion
    assert [(s.line, s.note) for s in found.related] == [(LOOKUP, "the lookup in embedding rows [8:16]")]
    assert found.reference is not None and (found.reference.file, found.reference.line) == (REFERENCE_FILE, 10)


def test_a_wrong_lower_bound_is_reported_at_its_comparison() -> None:
    found = _check(_kit({1: (0, 16, 8)}))
    assert at(found) == (PARALLEL_FILE, BELOW)
    assert "keeps token ids [0:16] but this rank holds embedding rows [8:16]" in found.message


def test_a_wrong_shift_is_reported_at_the_masked_ids() -> None:
    found = _check(_kit({1: (8, 16, 0)}))
    assert found is not None and found.kind == "wrong-shard"
    assert at(found) == (PARALLEL_FILE, FILL)
    assert found.message == "vocab-parallel embedding: local ids are shifted by 0 instead of 8"


def test_a_mask_and_shift_that_match_the_rows_are_right() -> None:
    assert _check(_kit(), rank=0) is None
    assert _check(_kit(), rank=1) is None


def test_another_ranks_mistake_is_not_this_ranks() -> None:
    assert _check(_kit({0: (0, 7, 0)}), rank=1) is None
    assert _check(_kit({0: (0, 7, 0)}), rank=0) is not None


def test_a_value_that_is_no_lookup_is_not_this_mistake() -> None:
    kit = _kit({1: (8, 15, 8)})
    kit.ref.op("scaled", "scalar", "w", out=(VOCAB, WIDTH), line=11, fn="mul", value=2.0)  # reads the weight
    ctx = kit.context()
    assert embedding_mask(ctx, ctx.ref_nodes["scaled"], 1) is None


# -- reading masks ------------------------------------------------------------------------------


def _interval(build) -> tuple[tuple[int, int] | None, int | None, int | None]:
    """(kept interval, shift, the line of the comparison to change) of the rank's `local` ids."""
    kit = Kit(1)
    kit.input("ids", *IDS, dtype=I64)
    build(kit.ranks[0])
    ctx = kit.context()
    kept, shift, culprit = mask_interval(ctx, ctx.rank_nodes[0], ctx.rank_nodes[0]["local"])
    return kept, shift, None if culprit is None or culprit.site is None else culprit.site.innermost.line


def test_a_fill_outside_an_interval_keeps_it() -> None:
    assert _interval(lambda rank: _masked_ids(rank, 8, 16, 8)) == ((8, 16), 8, OUTSIDE)
    # `ids > 15` states the same bound; it is the comparison a wrong bound is usually written in
    assert _interval(lambda rank: _masked_ids(rank, 8, 15, 8, high_fn="gt")) == ((8, 16), 8, ABOVE)


def test_a_where_keeping_an_interval_or_zeroing_outside_it_reads_alike() -> None:
    def keeping(rank: Program) -> None:  # where((ids >= 4) & (ids < 12), ids - 4, 0)
        rank.op("from", "scalar", "ids", out=IDS, dtype="bool", line=40, fn="ge", value=4)
        rank.op("to", "scalar", "ids", out=IDS, dtype="bool", line=41, fn="lt", value=12)
        rank.op("inside", "binary", "from", "to", out=IDS, dtype="bool", line=42, fn="and")
        rank.op("shifted", "scalar", "ids", out=IDS, dtype=I64, line=43, fn="sub", value=4)
        rank.op("zero", "constant", out=(), dtype=I64, line=44)
        rank.op("local", "where", "inside", "shifted", "zero", out=IDS, dtype=I64, line=45)

    def zeroing(rank: Program) -> None:  # where(~((ids >= 4) & (ids < 12)), 0, ids - 4)
        keeping(rank)
        rank.graph.nodes.pop()
        rank.op("outside", "unary", "inside", out=IDS, dtype="bool", line=46, fn="logical_not")
        rank.op("local", "where", "outside", "zero", "shifted", out=IDS, dtype=I64, line=47)

    assert _interval(keeping)[:2] == ((4, 12), 4)
    assert _interval(zeroing)[:2] == ((4, 12), 4)


def test_ids_not_masked_by_an_interval_have_none() -> None:
    def unmasked(rank: Program) -> None:
        rank.op("local", "scalar", "ids", out=IDS, dtype=I64, line=40, fn="sub", value=8)

    def one_sided(rank: Program) -> None:  # fill(ids - 8, ids < 8): no upper bound
        rank.op("below", "scalar", "ids", out=IDS, dtype="bool", line=40, fn="lt", value=8)
        rank.op("shifted", "scalar", "ids", out=IDS, dtype=I64, line=41, fn="sub", value=8)
        rank.op("local", "fill", "shifted", "below", out=IDS, dtype=I64, line=42, value=0)

    assert _interval(unmasked) == (None, None, None)
    assert _interval(one_sided) == (None, 8, None)


def test_a_pick_is_zeroed_outside_when_a_fill_reads_it() -> None:
    kit = Kit(1)
    kit.input("ids", *IDS, dtype=I64)
    rank = kit.ranks[0]
    rank.parameter("logits", "logits", *IDS, 8)
    rank.op("pick", "pick", "logits", "ids", out=IDS, line=40, dim=-1)
    rank.op("flat", "view", "pick", out=(16,), line=41, shape=[16])
    ctx = kit.context()
    assert not zeroed_outside(ctx, 0, ctx.rank_nodes[0]["pick"])
    rank.op("zeroed", "fill", "flat", "ids", out=(16,), line=42, value=0.0)
    ctx = kit.context()
    assert zeroed_outside(ctx, 0, ctx.rank_nodes[0]["pick"])
