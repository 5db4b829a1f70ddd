"""Parameter relations are inferred from the builder's own tensor operations."""

from fractions import Fraction

import torch
from torch import nn

from shardproof.capture.provenance import ProvenanceTracker
from shardproof.relations import expr as px


def _reference() -> tuple[ProvenanceTracker, nn.Module]:
    tracker = ProvenanceTracker()
    with tracker, torch.device("meta"):
        ref = nn.Linear(8, 6)
    for name, p in ref.named_parameters():
        tracker.register(p, px.ParamRef(name=name, shape=tuple(p.shape), dtype="float32"))
    return tracker, ref


def test_chunk_copied_into_a_fresh_parameter_is_a_slice() -> None:
    tracker, ref = _reference()
    with tracker, torch.device("meta"), torch.no_grad():
        local = nn.Linear(8, 3)
        local.weight.copy_(ref.weight.chunk(2, dim=0)[1])
    expr = tracker.expr_of(local.weight)
    assert isinstance(expr, px.SliceOf)
    assert (expr.dim, expr.start, expr.end) == (-2, 3, 6)
    assert isinstance(expr.source, px.ParamRef) and expr.source.name == "weight"
    assert expr.site is not None and expr.site.innermost is not None
    assert expr.site.innermost.file == __file__


def test_parameter_wrapping_data_assignment_and_columns() -> None:
    tracker, ref = _reference()
    with tracker, torch.device("meta"), torch.no_grad():
        wrapped = nn.Parameter(ref.weight.narrow(1, 4, 4))
        holder = nn.Linear(4, 6)
        holder.weight.data = ref.weight[:, :4].clone()
    first = tracker.expr_of(wrapped)
    second = tracker.expr_of(holder.weight)
    assert isinstance(first, px.SliceOf) and (first.dim, first.start, first.end) == (-1, 4, 8)
    assert isinstance(second, px.SliceOf) and (second.dim, second.start, second.end) == (-1, 0, 4)


def test_fused_weight_assembled_by_concatenation_and_region_writes() -> None:
    tracker, ref = _reference()
    with tracker, torch.device("meta"), torch.no_grad():
        fused = torch.cat([ref.weight[0:2], ref.weight[4:6]])
        target = torch.empty(4, 8)
        target[0:2].copy_(ref.weight[2:4])
        target[2:4].copy_(ref.weight[0:2])
    cat = tracker.expr_of(fused)
    assert isinstance(cat, px.CatOf) and [(p.start, p.end) for p in cat.parts] == [(0, 2), (4, 6)]
    written = tracker.expr_of(target)
    assert isinstance(written, px.CatOf) and [(p.start, p.end) for p in written.parts] == [(2, 4), (0, 2)]


def test_scaled_share_and_random_init() -> None:
    tracker, ref = _reference()
    with tracker, torch.device("meta"), torch.no_grad():
        share = ref.bias / 4
        fresh = nn.Linear(8, 6)
    expr = tracker.expr_of(share)
    assert isinstance(expr, px.ScaleOf) and expr.factor == Fraction(1, 4)
    problems = px.problems(tracker.expr_of(fresh.weight))
    assert problems and isinstance(problems[0], px.Fresh)


def test_recomputed_constants_get_the_same_identity() -> None:
    tracker = ProvenanceTracker()
    with tracker, torch.device("meta"):
        a = torch.arange(16).float().cos()
        b = torch.arange(16).float().cos()
        c = torch.arange(17).float().cos()
    ea, eb, ec = (tracker.expr_of(t) for t in (a, b, c))
    assert px.is_deterministic(ea)
    assert ea == eb
    assert ea != ec


def test_same_code_parameters_relate_by_name_and_shape() -> None:
    from shardproof.capture.same_code import same_code_relation
    from shardproof.relations.expr import Fresh, ParamRef, SliceOf

    own = Fresh(shape=(8, 16), dtype="float32", reason="uninitialised (empty)")
    full = ParamRef(name="w", shape=(8, 32), dtype="float32")
    # one dim world_size times smaller: the rank's contiguous block of it
    shard = same_code_relation(own, (8, 16), full, rank=1, world_size=2)
    assert isinstance(shard, SliceOf) and (shard.dim, shard.start, shard.end) == (-1, 16, 32)
    # the same shape: replicated
    assert same_code_relation(own, (8, 32), full, 1, 2) == full
    # nothing else is guessed: what the builder made stays (and is reported if unrelated)
    assert same_code_relation(own, (4, 16), full, 1, 2) == own
    assert same_code_relation(own, (8, 10), full, 1, 2) == own
    assert same_code_relation(own, (8, 16), None, 1, 2) == own


def test_a_declared_packed_shard_is_the_rank_block_of_every_part() -> None:
    import torch

    from shardproof.capture.same_code import declared_relation
    from shardproof.relations.expr import CatOf, Fresh, ParamRef
    from shardproof.witness.numeric import declared_value

    own = Fresh(shape=(4, 3), dtype="float32", reason="uninitialised (empty)")
    packed = ParamRef(name="fc1", shape=(8, 3), dtype="float32")  # [gate; up], 4 rows each
    expr = declared_relation(own, "packed-shard:0:2", packed, rank=1, world_size=2)
    assert isinstance(expr, CatOf) and expr.dim == -2 and expr.shape == (4, 3)
    assert [(p.start, p.end) for p in expr.parts] == [(2, 4), (6, 8)]
    # the witness loads the same rows
    values = torch.arange(24.0).reshape(8, 3)
    assert torch.equal(declared_value(values, "packed-shard:0:2", 1, 2), values[[2, 3, 6, 7]])


def test_a_view_back_to_its_source_shape_is_the_source() -> None:
    """A bias sliced as a column (`b[:, None].chunk(2)[r]`) and read back as a vector (`[:, 0]`)
    is the slice itself, not a view of it to its own shape."""
    tracker, ref = _reference()
    with tracker, torch.device("meta"), torch.no_grad():
        column = ref.bias[:, None].chunk(2, dim=0)[1].clone()
        local = nn.Parameter(column[:, 0])
    expr = tracker.expr_of(local)
    assert isinstance(expr, px.SliceOf) and (expr.dim, expr.start, expr.end) == (-1, 3, 6)
    assert isinstance(tracker.expr_of(column), px.ViewOf)  # the column itself is a view of the slice
