"""Attention as its documented math (capture/decompose.py `_attention`): the same function as
`F.scaled_dot_product_attention`, captured as operations the rules follow, and the identities
the encoder states about it (a twice-transposed key is the once-permuted key) hold on numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from term_values import unions_hold
from torch import nn

from shardproof.capture import folding
from shardproof.capture.decompose import _attention
from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph
from shardproof.verify.encode import encode_unit


@pytest.mark.parametrize(
    ("heads", "kv_heads", "queries", "keys", "causal", "scale"),
    [
        (4, 4, 6, 6, True, None),
        (4, 4, 6, 6, False, None),
        (4, 4, 6, 6, True, 0.3),
        (4, 2, 6, 6, True, None),  # grouped keys and values (enable_gqa)
        (2, 2, 3, 7, True, None),  # fewer queries than keys: the mask is aligned top-left, as torch's
        (2, 2, 7, 3, True, None),
    ],
)
def test_the_documented_math_is_torchs_attention(heads, kv_heads, queries, keys, causal, scale) -> None:
    generator = torch.Generator().manual_seed(heads + queries + keys)
    q = torch.randn(2, heads, queries, 5, dtype=torch.float64, generator=generator)
    k, v = (torch.randn(2, kv_heads, keys, 5, dtype=torch.float64, generator=generator) for _ in range(2))
    gqa = heads != kv_heads
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    assert torch.allclose(_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa), expected)


def _graph(forward, *shapes: tuple[int, ...]) -> Graph:
    class Module(nn.Module):
        def forward(self, *xs):
            return forward(*xs)

    inputs = tuple(torch.randn(shape, device="meta") for shape in shapes)
    program = torch.export.export(Module(), inputs, strict=False)
    return to_graph(program, "reference", None, 1, None)


def _heads(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def test_attention_is_captured_as_scores_scale_causal_mask_softmax_and_values() -> None:
    graph = _graph(
        lambda q, k, v: F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), is_causal=True),
        *[(2, 6, 4, 8)] * 3,
    )
    ops = [n.op for n in graph.nodes]
    assert "sdpa" not in ops
    (scale,) = [n for n in graph.nodes if n.op == "scalar" and n.attrs["fn"] == "mul"]
    assert scale.attrs["value"] == pytest.approx(8**-0.5)
    (fill,) = [n for n in graph.nodes if n.op == "fill"]
    mask = graph.node_map()[fill.inputs[1]]
    assert mask.attrs["folded"] == folding.value_digest(torch.ones(6, 6, dtype=torch.bool).triu(1))
    assert [n.op for n in graph.nodes if n.op in ("matmul", "reduce")] == ["matmul", "reduce", "reduce", "matmul"]
    assert all(n.site is not None and n.site.innermost.line == scale.site.innermost.line for n in graph.nodes[3:])


def test_attention_with_an_explicit_mask_is_written_out_with_torch_s_rows_without_a_key() -> None:
    # a float mask is added to the scores; the weights of a row the mask leaves without a key are
    # zeros, as torch gives them (a plain softmax gives NaN there)
    graph = _graph(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (2, 4, 6, 8),
        (2, 4, 6, 8),
        (2, 4, 6, 8),
        (6, 6),
    )
    nodes = graph.node_map()
    assert "sdpa" not in [n.op for n in graph.nodes]
    (zeroed,) = [n for n in graph.nodes if n.op == "fill"]
    assert float(zeroed.attrs["value"]) == 0.0
    weights, no_key = (nodes[i] for i in zeroed.inputs)
    assert weights.op == "binary" and weights.attrs["fn"] == "div"  # the softmax's normalisation
    assert no_key.op == "reduce" and no_key.attrs["fn"] == "all" and no_key.attrs["dim"] == -1
    minus_infinity = nodes[no_key.inputs[0]]
    assert minus_infinity.attrs["fn"] == "eq" and minus_infinity.attrs["value"] == "-inf"
    assert minus_infinity.inputs == ("xs_3",)  # where the mask alone leaves no key


def test_a_permutation_of_a_permutation_is_stated_as_one_and_holds() -> None:
    def moved(x):
        return x.transpose(1, 2).transpose(-2, -1), x.permute(0, 2, 1, 3).permute(0, 2, 1, 3)

    graph = _graph(moved, (2, 3, 4, 5))
    commands = encode_unit(graph, {}, []).commands
    composed = [c for c in commands if c.startswith("(let ") and '"0,2,3,1"' in c]
    assert composed, "the two transposes are one permutation of x"
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    assert unions_hold(commands, {"0": x}) == 2  # the composed permutation, and the identity


def test_a_permutation_of_repeated_heads_is_stated_as_the_repeat_of_the_permuted_heads() -> None:
    """Key heads repeated then moved (a rank's einsum) and moved then repeated (HF's repeat_kv)."""
    graph = _graph(lambda k: k.repeat_interleave(3, dim=2).permute(0, 2, 3, 1), (2, 5, 2, 4))
    commands = encode_unit(graph, {}, []).commands
    assert any(c.startswith("(union ") and "(Rep " in c and " -3 3)" in c for c in commands)
    k = torch.randn(2, 5, 2, 4, dtype=torch.float64)
    assert unions_hold(commands, {"0": k}) >= 2  # the repeat itself, and its permutation


def test_a_part_of_the_attention_and_a_mean_are_named_as_the_user_called_them() -> None:
    from shardproof.localize.wording import describe_op

    graph = _graph(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).mean(dim=-2), *[(2, 4, 6, 8)] * 3
    )
    names = [describe_op(n) for n in graph.nodes]
    assert "matmul in the attention" in names
    assert "mul by 0.353553 in the attention" in names
    assert names[-1] == "mean (the division by 6)"
