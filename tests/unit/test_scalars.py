"""How numbers are written in terms (verify/scalars.py): one term for one real function however
a program spells the number, and different numbers stay different."""

from __future__ import annotations

import math

import pytest

from shardproof.verify.scalars import scalar_term


@pytest.mark.parametrize(
    "spellings",
    [
        # torch's default attention scale and the ways programs write it for a 128-wide head
        [("mul", 1 / math.sqrt(128)), ("mul", 128**-0.5), ("div", math.sqrt(128)), ("div", 128**0.5)],
        [("mul", 8**-0.5), ("mul", 1.0 / math.sqrt(8)), ("div", math.sqrt(8))],
        [("mul", 0.5), ("div", 2.0), ("div", 2)],
        [("mul", 0.1), ("div", 10)],
    ],
)
def test_one_number_spelled_several_ways_is_one_term(spellings) -> None:
    assert len({scalar_term(fn, "$x", value) for fn, value in spellings}) == 1


def test_different_numbers_are_different_terms() -> None:
    scales = {scalar_term("mul", "$x", d**-0.5) for d in (4, 8, 16, 32, 64, 96, 128, 256)}
    assert len(scales) == 8
    assert scalar_term("add", "$x", 1e-6) != scalar_term("add", "$x", 1e-5)
    assert scalar_term("mul", "$x", 1 / 3) == '(ScI "div" $x 3)'
    assert scalar_term("pow", "$x", 2.0) == '(ScI "pow" $x 2)'
