"""Where the number a line uses was assigned (localize/assignments.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from shardproof.graph.model import Frame
from shardproof.localize.assignments import assignment_of_used_name

SOURCE = """
import math


class Attention:
    def __init__(self, width, heads):
        self.heads = heads
        self.scale = 1 / math.sqrt(width // heads)

    def forward(self, q, k):
        scores = (q @ k.transpose(-2, -1)) * self.scale
        local = q.size(-1) ** -0.5
        other = (q @ k.transpose(-2, -1)) * local
        both = q * k
        return scores, other, both
"""


def _frame(path: Path, text: str) -> Frame:
    lines = path.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if text in line)
    start = lines[number - 1].index(text)
    return Frame(str(path), number, "forward", text, start, number, start + len(text))


def test_an_attribute_is_found_in_the_class_and_a_local_name_in_the_function(tmp_path: Path) -> None:
    path = tmp_path / "attention.py"
    path.write_text(textwrap.dedent(SOURCE))
    scale = assignment_of_used_name(_frame(path, "(q @ k.transpose(-2, -1)) * self.scale"))
    assert scale is not None and scale.name == "self.scale" and scale.code.startswith("self.scale = 1 / math")
    local = assignment_of_used_name(_frame(path, "(q @ k.transpose(-2, -1)) * local"))
    assert local is not None and local.name == "local" and local.code == "local = q.size(-1) ** -0.5"


def test_tensors_are_not_numbers_and_nothing_is_guessed(tmp_path: Path) -> None:
    path = tmp_path / "attention.py"
    path.write_text(textwrap.dedent(SOURCE))
    assert assignment_of_used_name(_frame(path, "q * k")) is None  # parameters, no assignment
    edited = textwrap.dedent(SOURCE).replace("        self.heads = heads\n", "        self.scale = 0.5\n")
    path.write_text(edited)  # two assignments of self.scale: no single answer
    assert assignment_of_used_name(_frame(path, "(q @ k.transpose(-2, -1)) * self.scale")) is None


def test_a_number_other_lines_read_is_not_blamed_its_use_is(tmp_path: Path) -> None:
    path = tmp_path / "loss.py"
    path.write_text(
        textwrap.dedent("""
        def loss(logits, start, vocab_size):
            local_size = logits.shape[-1]
            end = start + local_size
            return logits.sum(-1) / local_size, end
        """)
    )
    assert assignment_of_used_name(_frame(path, "logits.sum(-1) / local_size")) is None
