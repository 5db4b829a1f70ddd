"""Check the equalities an encoder states on concrete tensors: evaluate its terms with the
reference semantics of the rule checks (rulecheck/meaning.py) and every union between terms
whose values are known."""

from __future__ import annotations

import torch
from torch import nn

from shardproof.capture.normalize import to_graph
from shardproof.graph.model import Graph
from shardproof.rulecheck.meaning import Evaluator, Unbound, Undefined, same
from shardproof.rulecheck.sexpr import head, read_all


def unions_hold(
    commands: list[str], inputs: dict[str, torch.Tensor], constants: dict[str, torch.Tensor] | None = None
) -> int:
    """Evaluate the terms on `inputs` (by input index) and `constants` (by digest, for the
    constants a test knows) and assert every union with known values; the number checked. A
    value stated equal to a known constant takes its value."""
    return _evaluated(commands, inputs, constants)[1]


def values_of(
    commands: list[str], inputs: dict[str, torch.Tensor], constants: dict[str, torch.Tensor] | None = None
) -> dict[str, object]:
    """The value of every term name `unions_hold` could evaluate (after asserting the unions)."""
    return _evaluated(commands, inputs, constants)[0]


def _evaluated(
    commands: list[str], inputs: dict[str, torch.Tensor], constants: dict[str, torch.Tensor] | None
) -> tuple[dict[str, object], int]:
    known = constants or {}
    env: dict[str, object] = {}
    evaluate = Evaluator(env)

    def value(term):
        if head(term) == "Const":
            if term[1].text not in known:
                raise Undefined(f"constant {term[1].text}")
            return known[term[1].text]
        if head(term) == "Fill" and head(term[2]) == "Const":  # a mask given as a known constant
            return value(term[1]).masked_fill(value(term[2]).bool(), float(term[3].text))
        return evaluate(term)

    checked = 0
    for form in read_all("\n".join(commands)):
        try:
            if head(form) == "let":
                term = form[2]
                env[form[1].name] = inputs[term[1].text] if head(term) == "Input" else value(term)
            elif head(form) == "union":
                right = value(form[2])
                if head(form[1]) is None and form[1].name not in env:
                    env[form[1].name] = right  # a constant the capture evaluated
                    continue
                assert same(value(form[1]), right), form
                checked += 1
        except (Unbound, Undefined, ValueError, KeyError):
            continue  # a term over a constant or a parameter this test does not know
    return env, checked


def traced(forward, *shapes: tuple[int, ...]) -> Graph:
    """The reference graph of `forward` on inputs of these shapes (meta tensors)."""

    class Call(nn.Module):
        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return forward(*args)

    inputs = tuple(torch.randn(s, device="meta") for s in shapes)
    return to_graph(torch.export.export(Call(), inputs, strict=False), "reference", None, 1, None)
