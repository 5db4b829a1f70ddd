"""Sums as multisets of their terms: addition's associativity and commutativity, without AC rules.

A chain of additions of one shape, `((0 + a) + b) + c`, is the sum of its terms `{a, b, c}` however
it is grouped or ordered, and a tensor of zeros adds nothing. The reference may accumulate
expert outputs one by one from `zeros_like(x)` while each rank accumulates only its own experts
and an all-reduce adds the ranks' sums: equal as sums of the same terms, never as the same tree.

AC rules in the e-graph would build every grouping of every subset (2^n classes for n terms), so the
sum is written once, as one n-ary node over the multiset of its terms (`SumN`, the node an
all-reduce is lowered to): each maximal chain of a program (an addition no further same-shape
addition consumes) is unioned with the `SumN` of its terms, and an all-reduce's result with the
`SumN` of all the terms of its inputs (or with one view or permute of that `SumN`, when every input
is the same view or permute of a chain: both are linear, so they move out of a sum). Multiset
equality is AC; the e-graph's congruence does the rest. The terms are read off the graph as written
(syntactically), so each stated equality holds by the laws of addition alone: only additions whose
operands have the result's shape and dtype are opened (no broadcasting, no type promotion), and only
constants made as zeros are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..graph.model import TensorMeta


@dataclass
class SumForms:
    zeros: set[str] = field(default_factory=set)  # terms made as zeros (factory constants)
    terms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # an opened addition -> its terms
    _inner: set[str] = field(default_factory=set)  # opened additions that another one opens
    _plain: set[str] = field(default_factory=set)  # opened additions whose terms are their operands
    # a view or a permute -> (its source, the op, its shape or permutation text, the source's shape
    # and dtype)
    moves: dict[str, tuple[str, str, str, tuple[int, ...], str]] = field(default_factory=dict)

    def add_zero(self, term: str) -> None:
        self.zeros.add(term)

    def note_addition(self, term: str, operands: list[str], metas: list[TensorMeta], out: TensorMeta) -> None:
        """Record the addition `term = operands[0] + operands[1]` when it may be opened."""
        if out.dtype == "bool" or any(m.shape != out.shape or m.dtype != out.dtype for m in metas):
            return
        parts = tuple(t for operand in operands for t in self.terms_of(operand))
        self.terms[term] = parts
        self._inner.update(operand for operand in operands if operand in self.terms)
        if parts == tuple(operands):
            self._plain.add(term)

    def note_view(self, term: str, source: str, shape: str, source_meta: TensorMeta) -> None:
        """Record `term = source.view(shape)`: a view of sums is the sum of the views."""
        self.moves[term] = (source, "View", shape, tuple(source_meta.shape), source_meta.dtype)

    def note_permute(self, term: str, source: str, perm: str, source_meta: TensorMeta) -> None:
        """Record `term = source.permute(perm)`: a permute of sums is the sum of the permutes."""
        self.moves[term] = (source, "Permute", perm, tuple(source_meta.shape), source_meta.dtype)

    def terms_of(self, value: str) -> tuple[str, ...]:
        """The terms a value adds up (itself unless it is an opened addition; none for zeros)."""
        if value in self.terms:
            return self.terms[value]
        return () if value in self.zeros else (value,)

    def maximal_chains(self) -> dict[str, tuple[str, ...]]:
        """Each maximal chain (an opened addition no other opened addition consumes): its terms."""
        return {term: parts for term, parts in self.terms.items() if term not in self._inner}

    def chain_facts(self) -> list[str]:
        """Each maximal chain equals the sum of its terms (nothing for one plain addition of two
        terms, which says that already)."""
        facts = []
        for term, parts in self.terms.items():
            if term not in self._inner and term not in self._plain:
                facts.extend(_equal(term, parts))
        return facts

    def total_facts(self, total: str, inputs: list[str]) -> list[str]:
        """An all-reduce's `total` of `inputs` equals the sum of all their terms (nothing when no
        input is an opened addition or a zero: then the terms are the inputs)."""
        parts = tuple(t for value in inputs for t in self.terms_of(value))
        moved = [self.moves.get(value) for value in inputs]
        if parts == tuple(inputs) and all(moved) and len({v[1:] for v in moved if v}) == 1:
            # every input is the same view or permute of a value of one shape (a chain viewed back
            # to the activation's shape, or transposed to put the scattered dim first, before its
            # all-reduce or reduce-scatter): the total is that movement of all their terms
            sources = [v[0] for v in moved if v]
            inner = tuple(t for source in sources for t in self.terms_of(source))
            if inner != tuple(sources) and inner:
                sum_term = inner[0] if len(inner) == 1 else f"(SumN (multiset-of {' '.join(inner)}))"
                _, op, text, _, _ = moved[0]  # type: ignore[misc]
                return [f'(union {total} ({op} {sum_term} "{text}"))']
        return [] if parts == tuple(inputs) else _equal(total, parts)


def _equal(term: str, parts: tuple[str, ...]) -> list[str]:
    if not parts:
        return []  # a sum of zeros: nothing to say that the zeros do not
    if len(parts) == 1:
        return [f"(union {term} {parts[0]})"]
    return [f"(union {term} (SumN (multiset-of {' '.join(parts)})))"]
