"""Constants a rank computes as its block of the reference's (verify/constant_blocks.py), tensors
a forward makes from Python data while traced on meta (capture/folding.LiteralValues), and the
masking forms written as fills (a uniform branch of `where`, a product with a negated mask)."""

from __future__ import annotations

import torch
from term_values import unions_hold
from torch import nn

from shardproof.capture import folding
from shardproof.capture.exporting import export_module
from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph
from shardproof.verify.constant_blocks import _blocks_of, _runs_of
from shardproof.verify.encode import encode_unit


def _graph(forward, name: str, rank: int | None, world_size: int, *shapes: tuple[int, ...]) -> Graph:
    class Module(nn.Module):
        def forward(self, *xs):
            return forward(*xs)

    inputs = tuple(torch.randn(shape, device="meta") for shape in shapes)
    return to_graph(export_module(Module(), inputs, "test"), name, rank, world_size, None)


def _reference_mask(x: torch.Tensor) -> torch.Tensor:
    s = x.shape[-1]
    return x.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))


def _rows_mask(rank: int, rows: int):
    def forward(x: torch.Tensor) -> torch.Tensor:
        s = x.shape[-1]
        visible = torch.arange(s)[None, :] <= torch.arange(rows)[:, None] + rank * rows
        return x.masked_fill(~visible, float("-inf"))

    return forward


def _slice_unions(mask, rows: dict[int, list[int]]) -> list[str]:
    """The unions with slices of the reference's causal mask that encoding states for two ranks
    masking their `rows` of an 8-token sequence (`mask(rank)` is the rank's forward), each checked
    on the masks' values."""
    reference = _graph(_reference_mask, "reference", None, 2, (8, 8))
    ranks = [(_graph(mask(r), f"rank{r}", r, 2, (len(rows[r]), 8)), {}) for r in range(2)]
    commands = encode_unit(reference, {}, ranks).commands
    future = ~torch.ones(8, 8, dtype=torch.bool).tril()
    known = {folding.value_digest(future): future}
    for own in rows.values():
        known[folding.value_digest(future[own])] = future[own]
    assert unions_hold(commands, {"0": torch.randn(8, 8, dtype=torch.float64)}, known) >= 2
    return [c for c in commands if c.startswith("(union ") and "(Slice " in c]


def test_a_rank_mask_of_its_rows_is_stated_the_slice_of_the_reference_mask() -> None:
    blocks = _slice_unions(lambda r: _rows_mask(r, 4), {r: list(range(r * 4, (r + 1) * 4)) for r in range(2)})
    assert len(blocks) == 2 and " -2 0 4)" in blocks[0] and " -2 4 8)" in blocks[1], blocks


def test_a_block_is_found_in_one_dimension_and_the_rank_s_own_first() -> None:
    whole = torch.arange(24).view(6, 4)
    assert _blocks_of(whole[2:4], whole, 1) == [(0, 2)]
    assert _blocks_of(whole[:, 1:3], whole, 0) == [(1, 1)]
    assert _blocks_of(whole[1:3, 1:3], whole, 0) == []  # two dims differ
    assert _blocks_of(whole[2:4].float(), whole, 1) == []  # another dtype
    repeated = torch.zeros(6, 4)
    assert _blocks_of(repeated[:2], repeated, 2) == [(0, 4), (0, 0)]  # equal blocks: its own, then another
    assert _blocks_of(torch.ones(2, 4), repeated, 0) == []


def _mirrored_rows_mask(rank: int, block: int):
    """A load-balanced context-parallel rank's mask: the rows of its block and of the mirror block."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        s = x.shape[-1]
        mirror = s - (rank + 1) * block
        rows = torch.cat([torch.arange(rank * block, (rank + 1) * block), torch.arange(mirror, mirror + block)])
        return x.masked_fill(~(torch.arange(s)[None, :] <= rows[:, None]), float("-inf"))

    return forward


def test_a_rank_mask_of_two_mirrored_blocks_is_the_concatenation_of_their_slices() -> None:
    rows = {r: [*range(r * 2, r * 2 + 2), *range(6 - r * 2, 8 - r * 2)] for r in range(2)}
    joined = _slice_unions(lambda r: _mirrored_rows_mask(r, 2), rows)
    # rank 0 holds rows [0:2] and [6:8]; rank 1's two blocks, [2:4] and [4:6], are one
    assert len(joined) == 2 and "(Cat (Slice " in joined[0] and " -2 0 2)" in joined[0] and " -2 6 8)" in joined[0]
    assert "(Cat " not in joined[1] and " -2 2 6)" in joined[1], joined


def test_blocks_are_read_in_one_dimension_and_only_a_few() -> None:
    whole = torch.arange(48).view(12, 4)
    assert _runs_of(torch.cat([whole[0:2], whole[8:11]]), whole) == (0, [(0, 2), (8, 11)])
    assert _runs_of(whole[::3], whole) == (0, [(0, 1), (3, 4), (6, 7), (9, 10)])
    assert _runs_of(whole[::1], whole) is None  # equal: no blocks to read
    assert _runs_of(torch.cat([whole[0:2], whole[4:6]])[:, 1:3], whole) is None  # two dims differ
    tall = torch.arange(96).view(24, 4)
    assert _runs_of(tall[::2], tall) is None  # twelve blocks: more than a few
    assert _runs_of(torch.cat([whole[0:1], torch.full((1, 4), -1)]), whole) is None  # a row that is none of its


def test_a_tensor_made_from_python_data_on_meta_keeps_its_value() -> None:
    slopes = [0.25, 0.0625, 0.015625]

    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor(slopes)[:, None]  # on CPU it cannot meet meta: traced on meta

    graph = _graph(forward, "reference", None, 1, (3, 5))
    (constant,) = [p for p in graph.placeholders if p.kind == "constant"]
    assert constant.digest == folding.value_digest(torch.tensor(slopes))
    # what the product reads (the slopes viewed as a column) is kept with its value
    assert [v for v in graph.constants.values() if torch.equal(v, torch.tensor(slopes)[:, None])]


def test_a_where_with_one_number_on_a_branch_is_a_fill() -> None:
    def forward(ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < 2) | (ids >= 5)
        kept = torch.where(outside, torch.zeros_like(ids), ids - 2)
        dropped = torch.where(outside, ids - 2, torch.full_like(ids, 7))
        return kept + dropped

    graph = _graph(forward, "reference", None, 1, (3, 4))
    fills = [n for n in graph.nodes if n.op == "fill"]
    assert [f.attrs["value"] for f in fills] == [0, 7]
    nodes = graph.node_map()
    assert nodes[fills[0].inputs[1]].attrs.get("fn") == "or"  # filled where the condition holds
    assert nodes[fills[1].inputs[1]].attrs.get("fn") == "logical_not"  # where it does not
    assert not any(n.op == "where" for n in graph.nodes)


def test_a_product_with_a_negated_mask_fills_where_the_mask_held() -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        outside = x[..., 0] > 0
        return x * (~outside)[..., None]

    graph = _graph(forward, "reference", None, 1, (3, 4))
    (fill,) = [n for n in graph.nodes if n.op == "fill"]
    mask = graph.node_map()[fill.inputs[1]]
    assert mask.op == "view" and graph.node_map()[mask.inputs[0]].attrs.get("fn") == "gt"  # no double negation
