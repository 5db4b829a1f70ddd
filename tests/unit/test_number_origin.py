"""Where shard numbers come from: traced builder numbers (capture/numbers.py) and the line the
localizer blames for a wrong cut (localize/number_origin.py), on small builders run per rank."""

from __future__ import annotations

import math
import pickle

import torch
from torch import nn

from shardproof.capture.numbers import TracedInt, plain_attributes, tracing_numbers
from shardproof.graph.numbers import BuilderNumbers
from shardproof.localize.number_origin import number_origin

ROWS = 30


def _record(builder, world_size: int) -> list:
    uses = []
    for rank in range(world_size):
        with tracing_numbers(rank, world_size) as (traced_rank, traced_world, recorded), torch.device("meta"):
            builder(torch.empty(ROWS, 4), traced_rank, traced_world)
        uses.append(BuilderNumbers(recorded.uses))
    return uses


def _line_of(function, text: str) -> tuple[str, int]:
    import inspect

    lines, first = inspect.getsourcelines(function)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return inspect.getsourcefile(function), first + offset


def _blamed(uses, cut_function, cut_text):
    origin = number_origin(uses, _line_of(cut_function, cut_text))
    return None if origin is None else (origin.frame.file, origin.frame.line, origin.frame.code, origin.how)


# -- builders --------------------------------------------------------------------------------------


def floor_block(total, world_size):
    return total // world_size  # wrong: the last rows are on no rank


def ceil_block(total, world_size):
    return -(-total // world_size)


def cut_by_block(weight, rank, world_size, block_of=floor_block):
    block = block_of(ROWS, world_size)
    start = rank * block
    return weight[start : min(start + block, ROWS)]


def start_one_ahead(rank, rows):
    return (rank + 1) * rows  # wrong: rank r takes block r + 1


def cut_from_start(weight, rank, world_size):
    rows = ROWS // world_size
    start = start_one_ahead(rank, rows)
    return weight.narrow(0, start, rows) if start + rows <= ROWS else weight[start : start + rows]


def cut_inline_off_by_one(weight, rank, world_size):
    rows = ROWS // world_size
    return weight[rank * rows : (rank + 1) * rows - 1]  # wrong, and wrong right here


def group_of(rank, groups):
    return rank % groups  # wrong: consecutive ranks share a group


def cut_by_group(weight, rank, world_size):
    group = group_of(rank, 2)
    return weight[group * 5 : (group + 1) * 5]


def offset_without_rank(world_size, rows):
    return world_size * rows - rows * world_size  # wrong: every rank starts at 0 (the rank is missing)


def cut_same_block_everywhere(weight, rank, world_size):
    rows = ROWS // world_size
    start = offset_without_rank(world_size, rows)
    return weight[start : start + rows]


def heads_per_rank(heads, world_size):
    return heads  # wrong: the world size is forgotten


def cut_by_heads(weight, rank, world_size):
    per_rank = heads_per_rank(6, world_size)  # six heads of five rows
    return weight[rank * per_rank * 5 : (rank + 1) * per_rank * 5]


def cut_hard_coded(weight, rank, world_size):
    rows = 8  # wrong: written for another world size
    return weight[rank * rows : (rank + 1) * rows]


def cut_short(weight, rank, world_size, buffer=False):
    block = ROWS // world_size - 1
    if buffer:
        torch.empty(block, 3)  # the number also sizes something else, where it is right
    return weight[rank * (ROWS // world_size) : rank * (ROWS // world_size) + block]


# -- tests ---------------------------------------------------------------------------------------


def test_traced_numbers_remember_their_computation_and_line() -> None:
    with tracing_numbers(3, 4) as (rank, world_size, _uses):
        block = -(-ROWS // world_size)
        start = rank * block
        end = min(start + block, ROWS)
        root = math.sqrt(world_size)
        assert (block, start, end, root) == (8, 24, 30, 2.0)
        assert isinstance(end, TracedInt) and end.step.op == "min"
        assert start.step.op == "*" and start.step.frame.code == "start = rank * block"
        assert start.step.frame.column is not None and start.step.frame.end_column is not None
        assert root.step.op == "sqrt" and math.ceil(ROWS / world_size).step.op == "ceil"
        assert type(int(start)) is int and type(pickle.loads(pickle.dumps(start))) is int
        assert list(range(world_size)) == [0, 1, 2, 3] and torch.Size([world_size]) == (4,)


def test_torch_calls_that_receive_traced_numbers_are_recorded_with_their_cut() -> None:
    (numbers,) = _record(cut_by_block, 1)
    (cut,) = numbers.uses
    assert cut.function == "getitem" and cut.dim == 0 and cut.cut[0] == "slice"
    assert [s.value for s in cut.cut[1:]] == [0, 30]
    uses = _record(cut_from_start, 2)[0].uses
    assert uses[0].function == "narrow" and uses[0].cut[0] == "narrow"


def test_plain_attributes_turn_traced_numbers_back_into_plain_ones() -> None:
    with tracing_numbers(1, 2) as (rank, world_size, _uses):
        module = nn.Linear(2, 2, device="meta")
        module.start, module.bounds = rank * 4, [rank, world_size]
    plain_attributes(module)
    assert type(module.start) is int and [type(b) for b in module.bounds] == [int, int]


def test_a_block_size_computed_in_a_helper_is_blamed_there() -> None:
    found = _blamed(_record(cut_by_block, 4), cut_by_block, "return weight[start")
    assert found is not None and found[2] == "return total // world_size  # wrong: the last rows are on no rank"
    assert found[3] == "tiling"


def test_a_start_computed_in_a_helper_is_blamed_there() -> None:
    uses = _record(cut_from_start, 2)
    found = _blamed(uses, cut_from_start, "return weight.narrow")
    assert found is not None and found[2].startswith("return (rank + 1) * rows")


def test_a_cut_wrong_in_its_own_arithmetic_stays_at_the_cut() -> None:
    assert _blamed(_record(cut_inline_off_by_one, 3), cut_inline_off_by_one, "return weight[") is None


def test_cuts_that_tile_are_not_a_wrong_number() -> None:
    def right(weight, rank, world_size):
        return cut_by_block(weight, rank, world_size, ceil_block)

    assert _blamed(_record(right, 4), cut_by_block, "return weight[start") is None


def test_a_block_index_computed_in_a_helper_is_blamed_there_when_no_tiling_is_meant() -> None:
    found = _blamed(_record(cut_by_group, 4), cut_by_group, "return weight[group")
    assert found is not None and found[2].startswith("return rank % groups") and found[3] == "block index"


def test_a_number_that_also_sizes_something_else_is_not_blamed_for_the_cut() -> None:
    found = _blamed(_record(cut_short, 3), cut_short, "return weight[")
    assert found is not None and found[2] == "block = ROWS // world_size - 1"

    def with_buffer(weight, rank, world_size):
        return cut_short(weight, rank, world_size, buffer=True)

    # `block` could make the cuts tile, but it also shapes a buffer: the cut is what to change
    assert _blamed(_record(with_buffer, 3), cut_short, "return weight[") is None


def test_a_number_that_should_read_the_rank_and_does_not_is_blamed_where_it_is_computed() -> None:
    found = _blamed(_record(cut_same_block_everywhere, 3), cut_same_block_everywhere, "return weight[start")
    assert found is not None and found[2].startswith("return world_size * rows - rows * world_size")


def test_a_cut_off_by_one_at_its_end_stays_at_the_cut_when_a_per_rank_size_would_hide_it() -> None:
    def odd_total(weight, rank, world_size):
        rows = 31 // world_size
        return weight[rank * rows : (rank + 1) * rows + 1]  # wrong here; rows per rank could mask it

    assert _blamed(_record(odd_total, 2), odd_total, "return weight[") is None


def test_a_plain_number_a_helper_returns_is_blamed_at_its_return() -> None:
    found = _blamed(_record(cut_by_heads, 3), cut_by_heads, "return weight[rank * per_rank")
    assert found is not None and found[2] == "return heads  # wrong: the world size is forgotten"


def test_a_hard_coded_number_is_blamed_at_its_assignment() -> None:
    found = _blamed(_record(cut_hard_coded, 3), cut_hard_coded, "return weight[rank * rows")
    assert found is not None and found[2] == "rows = 8  # wrong: written for another world size"


# -- constants --------------------------------------------------------------------------------------


def _constant(builder, world_size: int):
    with tracing_numbers(0, world_size) as (rank, traced_world, _uses):
        return builder(rank, traced_world)


def scale_from_local_width(rank, world_size):
    q_size = 32 // world_size  # this rank's width: right as a share
    return 1.0 / math.sqrt(q_size)  # wrong: the scale is 1 / sqrt(head dim)


def scale_from_local_heads(rank, world_size):
    heads = 4 // world_size
    head_dim = 32 // heads  # wrong: the head dim divides by every head, not this rank's
    return head_dim**-0.5


def divisor_from_local_width(rank, world_size):
    return 32 // world_size  # right as the local width; wrong only where it divides a full sum


def test_a_constant_is_blamed_at_the_computation_that_makes_it_wrong_never_at_a_share() -> None:
    from shardproof.localize.constant_origin import constant_origin

    scale = _constant(scale_from_local_width, 2)
    blamed = constant_origin(scale.step, 8**-0.5)
    assert blamed is not None and blamed.frame.code.startswith("return 1.0 / math.sqrt(q_size)")
    scale = _constant(scale_from_local_heads, 2)
    blamed = constant_origin(scale.step, 8**-0.5)
    assert blamed is not None and blamed.frame.code.startswith("head_dim = 32 // heads")
    # only the share could give 32: the share is right, its use is what to change
    assert constant_origin(_constant(divisor_from_local_width, 2).step, 32) is None


KEPT = """
def attention(scores, scale):
    return scores * scale


class Block:
    def forward(self, scores):
        return attention(scores, self.scale) + self.bias
"""


def test_a_number_an_operation_reads_is_followed_to_the_attribute_its_caller_passed(tmp_path) -> None:
    from shardproof.graph.model import Frame, SourceSite
    from shardproof.graph.numbers import AttributeNumber, NumberStep
    from shardproof.localize.kept_numbers import kept_number

    source = tmp_path / "kept.py"
    source.write_text(KEPT)
    file = str(source)
    use = Frame(file, 3, "attention", "return scores * scale", 11, 3, 25)
    call = Frame(file, 8, "forward", "return attention(scores, self.scale) + self.bias", 15, 8, 43)
    site = SourceSite((call, use))
    scale, bias = NumberStep(0.25, "/"), NumberStep(3, "//")
    numbers = BuilderNumbers(
        [], [AttributeNumber(file, "Block", "scale", scale), AttributeNumber(file, "Block", "bias", bias)]
    )
    found = kept_number(site, use, numbers, lambda value: value == 0.25)
    assert found is not None and found[0] is scale and found[1] == "self.scale"
    # the number the operation used is not that attribute's: nothing is claimed
    assert kept_number(site, use, numbers, lambda value: value == 0.5) is None
