"""The joint forward-backward capture (capture/gradients.py) on small modules, without a
process group: tied parameters are one leaf, autograd's derivatives take the forward line, and
a user's detach is recorded as a place gradients stop."""

from __future__ import annotations

import torch
from torch import nn

from shardproof.capture.frames import parse_stack_trace
from shardproof.capture.gradients import JointSpec, trace_joint


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        return self.head(torch.tanh(hidden.detach() + hidden)).sum()


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source.read().splitlines(), 1) if text in line)


def _trace() -> object:
    with torch.device("meta"):
        module = Tied()
    return trace_joint(JointSpec(module, (torch.zeros(2, 3, dtype=torch.long, device="meta"),), None))


def test_a_tied_parameter_has_one_gradient() -> None:
    program = _trace()
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 3  # the tied weight, the tokens, the loss's cotangent
    gradients = [role for role in program.roles if role is not None]
    assert [role.parameter for role in gradients] == ["embed.weight"]


def test_derivatives_carry_the_line_of_the_forward_operation() -> None:
    program = _trace()
    line = _line_of("torch.tanh(")
    backward = [n for n in program.graph.nodes if n.meta.get("autograd_backward")]
    assert backward, "no backward node was marked"
    tanh_grads = [n for n in backward if "tanh" in str(n.target) or "mul" in str(n.target)]
    sites = {
        parse_stack_trace(n.meta.get("stack_trace")).innermost.line for n in tanh_grads if n.meta.get("stack_trace")
    }
    assert line in sites


def test_a_detach_in_the_forward_is_recorded_at_its_line() -> None:
    program = _trace()
    line = _line_of("hidden.detach()")
    (cut,) = program.cuts
    assert cut.innermost.line == line
    with open(__file__) as source:
        text = source.read().splitlines()[line - 1]
    assert text[cut.innermost.column : cut.innermost.end_column] == "hidden.detach()"
