"""A logsumexp is written out as torch's reference computes it (the maximum, the log of the sum of
the shifted exponentials, the maximum added back: the pieces a vocabulary-parallel program
computes on its shard), and a reduction keeping its dim is stated equal to the one without it,
viewed with a size-1 dim (capture/normalize.py `_logsumexp`, verify/encode.py `_kept_twin`); the
unions are checked on concrete tensors, the verdicts on a program keeping the dims against a
reference that does not (and the other way round)."""

from __future__ import annotations

import pytest
import torch
from term_values import traced, unions_hold, values_of

from shardproof.verify.encode import Encoder, encode_unit


@pytest.mark.parametrize(("dims", "keepdim"), [(-1, False), (-1, True), ((0, 2), False), ((1, 2), True)])
def test_a_logsumexp_is_the_maximum_plus_the_log_of_the_shifted_exponentials_summed(dims, keepdim) -> None:
    graph = traced(lambda x: torch.logsumexp(x, dim=dims, keepdim=keepdim), (3, 4, 5))
    ops = [(n.op, n.attrs.get("fn")) for n in graph.nodes]
    assert ("reduce", "logsumexp") not in ops
    count = 1 if isinstance(dims, int) else len(dims)
    assert ops.count(("reduce", "amax")) == ops.count(("reduce", "sum")) == ops.count(("unary", "exp")) == count
    expected = torch.logsumexp(torch.randn(3, 4, 5), dim=dims, keepdim=keepdim).shape
    assert graph.meta_of(graph.outputs[0]).shape == tuple(expected)
    # its value: the encoder's terms evaluated with the rule checker's meaning of each operation
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    values = values_of(encode_unit(graph, {}, []).commands, {"0": x})
    assert torch.allclose(values[Encoder()._name(graph.name, graph.outputs[0])], torch.logsumexp(x, dims, keepdim))


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("fn", ["sum", "amax", "mean"])
def test_a_reduction_and_its_twin_with_the_other_keepdim_are_stated_equal(fn, keepdim) -> None:
    graph = traced(lambda x: getattr(x, fn)(dim=1, keepdim=keepdim), (2, 3, 4))
    commands = encode_unit(graph, {}, []).commands
    twins = [c for c in commands if c.startswith("(let ") and (" 1)" in c or " 0)" in c) and "(Red " in c]
    assert len(twins) == 2, "the reduction as captured, and its twin"
    assert unions_hold(commands, {"0": torch.randn(2, 3, 4, dtype=torch.float64)}) >= 1
