"""How a number in a program is written in a term: one term for one real function, however the
program spells the number (see `scalar_term`)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from .language import quoted as _q

SIGNIFICANT_DIGITS = 12


def scalar_term(fn: str, operand: str, value: Any) -> str:
    """The term of `operand <fn> value`, one term for one real function however the program
    spells it: times 1/n is division by n and division by c is times 1/c (exactly so when the
    float is exactly 1/n, e.g. baddbmm's alpha 0.5 and a division by 2.0), and a float is its
    value to `SIGNIFICANT_DIGITS` digits: the verifier reasons about real numbers, rounding
    aside, and the same number computed two ways (`head_dim ** -0.5`, `1 / math.sqrt(head_dim)`,
    torch's default attention scale) differs in its last bit."""
    if isinstance(value, bool):
        value = int(value)
    if fn in ("mul", "div") and isinstance(value, float) and math.isfinite(value) and value != 0:
        exact = Fraction(value)
        inverse = _rounded(1.0 / value)
        if exact.numerator == 1 and exact.denominator > 1:
            fn, value = ("div" if fn == "mul" else "mul"), exact.denominator
        elif fn == "mul" and inverse.is_integer() and abs(inverse) > 1:
            fn, value = "div", inverse  # times 0.1 is division by 10
        elif fn == "div" and not _rounded(value).is_integer():
            fn, value = "mul", inverse  # division by sqrt(head_dim) is times its inverse
    if isinstance(value, float) and math.isfinite(value):
        value = _rounded(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    if isinstance(value, int):
        return f"(ScI {_q(fn)} {operand} {value})"
    return f"(Sc {_q(fn)} {operand} {_q(repr(value))})"


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def fill_value(value: Any) -> str:
    if isinstance(value, bool):
        return repr(float(value))
    if isinstance(value, int | float):
        return repr(float(value))
    return str(value)


def scaled_term(term: str, factor: Fraction) -> str:
    """factor * term, written the same way wherever the same factor appears."""
    if factor == 1:
        return term
    if factor.denominator != 1:
        term = f'(ScI "div" {term} {factor.denominator})'
    if factor.numerator != 1:
        term = f'(ScI "mul" {term} {factor.numerator})'
    return term


def float_factor(fn: str, value: Any) -> float | None:
    """The multiplier of `operand <fn> value` when `scalar_term` writes it `(Sc "mul" ...)` (a
    float factor that is not the reciprocal of an integer), else None."""
    if fn not in ("mul", "div") or isinstance(value, bool) or not isinstance(value, int | float) or value == 0:
        return None
    if not scalar_term(fn, "x", value).startswith('(Sc "mul" x '):
        return None
    return float(value) if fn == "mul" else 1.0 / float(value)


def integer_factor(fn: str, value: Any) -> int | None:
    """The integer of `operand <fn> value` when `scalar_term` writes it `(ScI "mul" ...)` or
    `(ScI "div" ...)`, else None."""
    if fn not in ("mul", "div") or isinstance(value, bool) or not isinstance(value, int | float) or value == 0:
        return None
    term = scalar_term(fn, "x", value)
    for form in ('(ScI "mul" x ', '(ScI "div" x '):
        if term.startswith(form):
            return int(term[len(form) : -1])
    return None


def factor_text(factor: float) -> str:
    """How a `(Sc "mul" x c)` term writes its factor c."""
    return repr(_rounded(factor))


def product_fact(first: float, then: float) -> str | None:
    """The fact that scaling by `first` then by `then` is scaling by their product, in the form
    the product's own term takes: `(scprod a b c)` for `(Sc "mul" x c)`, `(scprodrecip a b n)` for
    `(ScI "div" x n)` (a product that is exactly 1/n); None for any other form."""
    product = scalar_term("mul", "x", first * then)
    a, b = _q(factor_text(first)), _q(factor_text(then))
    for form, relation in (('(Sc "mul" x ', "scprod"), ('(ScI "div" x ', "scprodrecip")):
        if product.startswith(form):
            return f"({relation} {a} {b} {product[len(form) : -1]})"
    return None


_MOST_INTEGER_PRODUCTS = 1024  # (a b c) facts; the factors of real programs are few and small


def integer_product_facts(integers: list[int]) -> list[str]:
    """`(scintprod a b c)`, c = a * b, for a a product of up to two of the program's integer
    factors and b one of them (a share of a share of a share: rules_reductions.py; a scaling of a
    scaling: rules_scalars.py). Stated, never computed in egglog, so the products are finite."""
    facts: list[str] = []
    known, seen = set(integers), set()
    for _ in range(2):
        found = set()
        for a in sorted(known):
            for b in integers:
                if (a, b) in seen or abs(a * b) >= 2**31:
                    continue
                seen.add((a, b))
                facts.append(f"(scintprod {a} {b} {a * b})")
                found.add(a * b)
                if len(facts) >= _MOST_INTEGER_PRODUCTS:
                    return facts
        known |= found
    return facts
