"""Identities of permutations the encoder states as equalities between terms.

Programs move the same dims in different orders: a key transposed for the attention call and
transposed again inside it (`k.transpose(1, 2)`, then `.transpose(-2, -1)`) is the key a program
permutes once (`einsum("bshd,bthd->bhst", q, k)`); key heads repeated after the heads were moved
to dim 1 (Hugging Face's `repeat_kv`) are the heads repeated first and moved after. Both are
identities of data movement, stated for every permutation the encoder writes:

  x.permute(p).permute(q) == x.permute([p[i] for i in q])    (x itself when that is the identity)
  x.repeat_interleave(m, d).permute(p) == x.permute(p).repeat_interleave(m, p.index(d))

Each permutation a statement needs is written once (`Permutations.permute`) and states its own
identities in turn, so a chain of permutations and repeats meets its shortest form while every
form the programs wrote stays a term the rules can match. (A permutation's dim map is a fact
about the permutation, `pmap`, not about its e-class, so one class may hold permutations of
different sources.)
"""

from __future__ import annotations

from collections.abc import Callable


class Permutations:
    """What the encoder knows of its terms' permutations and repeats, and the equalities they give."""

    def __init__(self, make: Callable[[str, list[int]], str], emit: Callable[[str], None]) -> None:
        # make(source, perm): a new term for source.permute(perm) (with its shape and dim facts);
        # emit(command): add an egglog command
        self._make = make
        self._emit = emit
        self._permuted: dict[str, tuple[str, list[int]]] = {}  # term -> (its source, perm)
        self._repeated: dict[str, list[tuple[str, int, int]]] = {}  # term -> [(source, dim, times)]
        self._made: dict[tuple[str, tuple[int, ...]], str] = {}

    def note_repeat(self, term: str, source: str, dim: int, times: int) -> None:
        """`term` is `source` with every slice of `dim` (negative) repeated `times` times."""
        self._repeated.setdefault(term, []).append((source, dim, times))

    def note_permute(self, term: str, source: str, perm: list[int]) -> None:
        """`term` is `source.permute(perm)`: state what it equals besides."""
        self._permuted[term] = (source, perm)
        inner = self._permuted.get(source)
        if inner is not None:
            origin, first = inner
            composed = [first[i] for i in perm]
            once = origin if composed == sorted(composed) else self.permute(origin, composed)
            self._emit(f"(union {term} {once})")
        nd = len(perm)
        for repeated, dim, times in self._repeated.get(source, []):
            moved = perm.index(dim % nd) - nd
            self._emit(f"(union {term} (Rep {self.permute(repeated, perm)} {moved} {times}))")

    def permute(self, source: str, perm: list[int]) -> str:
        """The term of source.permute(perm), written once."""
        key = (source, tuple(perm))
        if key not in self._made:
            term = self._made[key] = self._make(source, perm)
            self.note_permute(term, source, perm)
        return self._made[key]
