"""Captured programs in the verifier's vocabulary (capture/normalize.py), on small modules traced
on meta tensors."""

from __future__ import annotations

import torch
from torch import nn

from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph


def _graph(forward, *shapes: tuple[int, ...]) -> Graph:
    class Module(nn.Module):
        def forward(self, *xs):
            return forward(*xs)

    inputs = tuple(torch.randn(shape, device="meta") for shape in shapes)
    program = torch.export.export(Module(), inputs, strict=False)
    graph = to_graph(program, "reference", None, 1, None)
    # the program as written: without the twins of flattened values (test_leading_dims.py), which
    # no output reads
    needed = set(graph.outputs)
    for node in reversed(graph.nodes):
        if node.id in needed:
            needed.update(node.inputs)
    graph.nodes = [n for n in graph.nodes if n.id in needed]
    return graph


def test_a_reduction_over_several_dims_reduces_each_of_them_in_turn() -> None:
    graph = _graph(lambda x: x.sum(dim=(0, 1)), (2, 3, 4))
    steps = [(n.attrs["dim"], n.meta.shape) for n in graph.nodes if n.op == "reduce"]
    # each step names a dim of the value it reduces: [2, 3, 4] -> [3, 4] -> [4]
    assert steps == [(-3, (3, 4)), (-2, (4,))]
    assert graph.nodes[-1].meta.shape == (4,)


def test_a_mean_of_every_element_is_the_mean_of_the_flattened_value() -> None:
    graph = _graph(lambda x: x.mean(), (2, 3))
    assert [(n.op, n.meta.shape) for n in graph.nodes] == [("view", (6,)), ("reduce", ()), ("scalar", ())]
    assert graph.nodes[-1].attrs == {"fn": "div", "value": 6}


def test_a_mean_is_the_sum_divided_by_the_number_of_elements_summed() -> None:
    graph = _graph(lambda x: x.mean(dim=1, keepdim=True), (2, 3, 4))
    (total, mean) = graph.nodes
    assert (total.op, total.attrs["fn"], total.attrs["dim"], total.meta.shape) == ("reduce", "sum", -2, (2, 1, 4))
    assert (mean.op, mean.inputs, mean.attrs) == ("scalar", (total.id,), {"fn": "div", "value": 3})
    assert graph.outputs == [mean.id]


def test_cross_entropy_is_written_out_over_the_unflattened_tokens() -> None:
    def loss(x, t):
        return torch.nn.functional.cross_entropy(x.view(-1, 5), t.long().view(-1), reduction="sum")

    graph = _graph(loss, (2, 3, 5), (2, 3))
    picks = [n for n in graph.nodes if n.op == "pick"]
    assert [(p.attrs["dim"], p.meta.shape) for p in picks] == [(-1, (2, 3))]
    # the per-token loss flattened to [6], then summed
    assert [(n.op, n.meta.shape) for n in graph.nodes[-2:]] == [("view", (6,)), ("reduce", ())]


def test_einsum_is_written_as_the_permutes_views_and_matmul_it_computes() -> None:
    graph = _graph(lambda a, b: torch.einsum("gtec,gtm->egcm", a, b), (2, 5, 3, 4), (2, 5, 6))
    ops = [n.op for n in graph.nodes]
    assert "generic" not in ops and ops.count("matmul") == 1
    (product,) = [n for n in graph.nodes if n.op == "matmul"]
    assert product.meta.shape == (2, 12, 6)  # batch g, free e*c, free m; t contracted
    assert graph.nodes[-1].meta.shape == (3, 2, 4, 6)


def test_einsum_contracting_two_letters_merges_them() -> None:
    graph = _graph(lambda a, b: torch.einsum("gtec,egcm->gtm", a, b), (2, 5, 3, 4), (3, 2, 4, 6))
    (product,) = [n for n in graph.nodes if n.op == "matmul"]
    assert product.meta.shape == (2, 5, 6)
    assert "generic" not in [n.op for n in graph.nodes]


def test_routing_ops_are_in_the_vocabulary() -> None:
    def route(probs):
        weights, chosen = probs.topk(2, dim=-1)
        slot = torch.nn.functional.one_hot(chosen, 4).cumsum(dim=1).clamp(0, 3)
        return weights, slot

    graph = _graph(route, (2, 5, 4))
    along = [(n.attrs["fn"], n.attrs["dim"], n.attrs["index"]) for n in graph.nodes if n.op == "along"]
    assert along == [("topk", -1, 0), ("topk", -1, 1), ("cumsum", -3, 0)]
    assert [n.attrs["fn"] for n in graph.nodes if n.op == "scalar"] == ["maximum", "minimum"]
    assert any(n.op == "binary" and n.attrs["fn"] == "eq" for n in graph.nodes)  # one_hot: ids == arange
    assert "generic" not in [n.op for n in graph.nodes]


def test_a_division_that_rounds_is_not_a_division() -> None:
    graph = _graph(lambda x: torch.div(x, 2, rounding_mode="floor"), (4,))
    assert [n.op for n in graph.nodes] == ["generic"]


def test_ones_like_is_a_constant_of_the_shape_whatever_the_value() -> None:
    first = _graph(lambda x: torch.ones_like(x.sum()), (4,))
    second = _graph(lambda x: torch.ones_like(x.mean() * 3), (4,))
    (a,) = [n for n in first.nodes if n.op == "constant"]
    (b,) = [n for n in second.nodes if n.op == "constant"]
    assert a.attrs["digest"] == b.attrs["digest"]


def test_a_linear_spelled_as_an_einsum_broadcasts_the_leading_dims() -> None:
    graph = _graph(lambda x, w: torch.einsum("bsh,oh->bso", x, w), (2, 3, 4), (5, 4))
    assert [(n.op, n.meta.shape) for n in graph.nodes] == [("permute", (4, 5)), ("matmul", (2, 3, 5))]


def test_an_op_without_a_lowering_of_ours_is_written_as_torch_decomposes_it() -> None:
    graph = _graph(lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b), (2, 3, 4), (4,), (4,))
    ops = [n.op for n in graph.nodes]
    assert "generic" not in ops
    # var_mean, ours: the mean, the sum of squared deviations, the mean (each mean a sum / count)
    assert [n.attrs["fn"] for n in graph.nodes if n.op == "reduce"] == ["sum", "sum", "sum"]
    assert [n.attrs["value"] for n in graph.nodes if n.op == "scalar" and n.attrs["fn"] == "div"][-1] == 4
    assert graph.nodes[-1].meta.shape == (2, 3, 4)
    site_lines = {n.site.innermost.line for n in graph.nodes if n.site is not None}
    assert len(site_lines) <= 1  # every operation of the decomposition is at the call's line


def test_random_and_rule_matched_ops_stay_whole() -> None:
    graph = _graph(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) + torch.lgamma(x), (2, 3))
    assert not any("bernoulli" in str(n.attrs.get("target", "")) for n in graph.nodes if n.op != "generic")
    from shardproof.capture.decompose import decomposition_of
    from shardproof.verify.opaque_rules import opaque_ops

    assert "aten::embedding_dense_backward" in opaque_ops()
    assert decomposition_of(torch.ops.aten.var_mean.correction) is not None  # ours (torch's is in prims)


def test_a_strided_slice_is_a_view_a_slice_and_a_view() -> None:
    """x[..., 1::2] (GPT-J interleaved rotary halves) reads index 1 of each pair of the last dim."""
    graph = _graph(lambda x: x[..., 1::2], (2, 3, 8))
    assert [(n.op, n.meta.shape) for n in graph.nodes] == [
        ("view", (2, 3, 4, 2)),
        ("slice", (2, 3, 4, 1)),
        ("view", (2, 3, 4)),
    ]
    assert graph.nodes[1].attrs == {"dim": -1, "start": 1, "end": 2}
    # a step that does not divide the dim stays one call (never the raw as_strided)
    odd = _graph(lambda x: x[..., ::3], (2, 8))
    assert not any("as_strided" in str(n.attrs.get("target", "")) for n in odd.nodes)


def test_a_decomposition_that_writes_into_fresh_memory_is_not_taken() -> None:
    """torch.polar decomposes into new_empty and copies into its real and imaginary views; inlined
    without its writes it would read the uninitialised buffer (transformers' DeepSeek-V2 rotary)."""
    graph = _graph(lambda a, b: torch.view_as_real(torch.polar(a, b)), (2, 3), (2, 3))
    assert not any(n.op == "uninitialized" for n in graph.nodes)
    assert any("polar" in str(n.attrs.get("target", "")) for n in graph.nodes if n.op == "generic")


def test_a_product_with_a_boolean_mask_is_the_fill_of_its_negation_with_zero() -> None:
    graph = _graph(lambda x, y: x * (y > 0), (2, 3), (2, 3))
    (fill,) = [n for n in graph.nodes if n.op == "fill"]
    negation = graph.node_map()[fill.inputs[1]]
    assert fill.attrs["value"] == 0.0 and (negation.op, negation.attrs["fn"]) == ("unary", "logical_not")
    assert not [n for n in graph.nodes if n.op == "binary" and n.attrs.get("fn") == "mul"]
    # a mask that the other factor broadcasts over stays a product: its shape is not the value's
    graph = _graph(lambda x, y: x * (y > 0), (3,), (2, 3))
    assert [n for n in graph.nodes if n.op == "binary" and n.attrs.get("fn") == "mul"]


def test_a_mean_cross_entropy_with_label_smoothing_names_every_step_once() -> None:
    def loss(x, t):
        return torch.nn.functional.cross_entropy(x.view(-1, 5), t.long().view(-1), label_smoothing=0.1)

    graph = _graph(loss, (2, 3, 5), (2, 3))
    ids = [n.id for n in graph.nodes]
    assert len(ids) == len(set(ids))
    assert graph.nodes[-1].attrs == {"fn": "div", "value": 6}  # the mean over the 6 tokens


def test_a_constant_pad_is_the_value_between_blocks_of_the_constant() -> None:
    graph = _graph(lambda x: torch.nn.functional.pad(x, (1, 2, 0, 3)), (2, 3, 4))
    cats = [n for n in graph.nodes if n.op == "cat"]
    pads = {n.id: n for n in graph.nodes if n.op == "constant"}
    # the last dim first: 1 before and 2 after, then 3 rows after along the one before it
    assert [(c.attrs["dim"], c.meta.shape) for c in cats] == [(-1, (2, 3, 7)), (-2, (2, 6, 7))]
    assert [pads[i].meta.shape if i in pads else "x" for i in cats[0].inputs] == [(2, 3, 1), "x", (2, 3, 2)]
    assert [pads[i].meta.shape if i in pads else "padded" for i in cats[1].inputs] == ["padded", (2, 3, 7)]
    assert all(p.attrs.get("zero") for p in pads.values())
    assert graph.outputs == [cats[-1].id]


def test_a_pad_that_crops_stays_an_opaque_call() -> None:
    graph = _graph(lambda x: torch.nn.functional.pad(x, (0, -1)), (2, 4))
    assert [n.op for n in graph.nodes] == ["generic"]
