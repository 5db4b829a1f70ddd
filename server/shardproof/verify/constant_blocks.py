"""A rank's constant that is a block of one of the reference's constants.

Masks and biases computed from literals alone are evaluated while capturing (capture/folding.py);
equal values are one constant. A rank often computes only its block of the reference's constant,
written differently: context parallelism's causal mask for its rows of queries
(`arange(s)[None] <= arange(n)[:, None] + rank * n` against `ones(s, s).tril()`), the ALiBi
slopes of its heads. Where a rank's constant equals a contiguous block of one dimension of a
reference constant (compared value by value), the rank's value is stated to be that slice of the
reference's; where it equals a few blocks of one dimension joined (a load-balanced rank's rows:
its block of the sequence and the mirror block), the concatenation of those slices: facts of
evaluation, sound for any program. Only constants made by the same
operation are compared: an equality between constants made otherwise (a column of a mask and a
test of its rows) is true but a coincidence that would mislead the localizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..graph.model import Graph
    from .encode import Encoder


def constant_block_facts(encoder: Encoder, reference: Graph, ranks: list[Graph]) -> list[str]:
    """Unions of each rank constant with the slices of reference constants it equals."""
    known = _encoded(encoder, reference)
    if not known:
        return []
    from ..capture.folding import value_digest  # torch: only where there are constants to compare

    digests = {value_digest(value) for value in known.values()}
    made_by = {ref_id: _made_by(encoder, reference, ref_id) for ref_id in known}
    facts: list[str] = []
    for graph in ranks:
        for value_id, value in _encoded(encoder, graph).items():
            if value_digest(value) in digests:
                continue  # equal to a reference constant: already one term
            role = _made_by(encoder, graph, value_id)
            for ref_id, whole in known.items():
                if made_by[ref_id] != role:
                    continue  # equal values made otherwise (a column of a mask and a row test) are a coincidence
                blocks = _blocks_of(value, whole, graph.rank)
                for dim, start in blocks:
                    end = start + value.shape[dim]
                    # dims are written counted from the last (encode.py)
                    sliced = f"(Slice {encoder.term(reference, ref_id)} {dim - whole.dim()} {start} {end})"
                    facts.append(f"(union {encoder.term(graph, value_id)} {sliced})")
                runs = _runs_of(value, whole) if not blocks else None
                if runs is not None:
                    dim, spans = runs
                    source = encoder.term(reference, ref_id)
                    pieces = [f"(Slice {source} {dim - whole.dim()} {a} {b})" for a, b in spans]
                    joined = pieces[0]
                    for piece in pieces[1:]:
                        joined = f"(Cat {joined} {piece} {dim - whole.dim()})"
                    facts.append(f"(union {encoder.term(graph, value_id)} {joined})")
    return facts


def _made_by(encoder: Encoder, graph: Graph, value_id: str) -> tuple[Any, ...]:
    """The operation that made a constant (a lifted one: its kind): the reference's counterpart of a
    rank's block is made by the same one (`~mask` of both, the ALiBi product of both)."""
    node = encoder._nodes_of(graph).get(value_id)
    return ("placeholder",) if node is None else (node.op, node.attrs.get("fn"))


def _encoded(encoder: Encoder, graph: Graph) -> dict[str, Any]:
    return {v: value for v, value in graph.constants.items() if (graph.name, v) in encoder.term_of}


def _narrower_dim(part: Any, whole: Any) -> int | None:
    """The one dimension where `part` is narrower than `whole` (same dtype and rank, every other
    size equal), else None."""
    if part.dtype != whole.dtype or part.dim() != whole.dim():
        return None
    differing = [d for d in range(whole.dim()) if part.shape[d] != whole.shape[d]]
    if len(differing) != 1 or part.shape[differing[0]] > whole.shape[differing[0]]:
        return None
    return differing[0]


_MOST_RUNS = 8  # a constant made of more blocks than this is not read as blocks


def _runs_of(part: Any, whole: Any) -> tuple[int, list[tuple[int, int]]] | None:
    """(dim, spans) where `part` is the concatenation of several blocks of one dimension of
    `whole` (a load-balanced context-parallel rank's causal-mask rows: its first block of the
    sequence and its mirror block at the end), each block extended as far as it matches and the
    next one started at the first index that matches; None when it is not (or needs more than
    `_MOST_RUNS` blocks)."""
    dim = _narrower_dim(part, whole)
    if dim is None:
        return None
    spans: list[tuple[int, int]] = []
    for index in range(part.shape[dim]):
        row = part.narrow(dim, index, 1)
        if spans and spans[-1][1] < whole.shape[dim] and bool((whole.narrow(dim, spans[-1][1], 1) == row).all()):
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
            continue
        match = next((j for j in range(whole.shape[dim]) if bool((whole.narrow(dim, j, 1) == row).all())), None)
        if match is None or len(spans) == _MOST_RUNS:
            return None
        spans.append((match, match + 1))
    return (dim, spans) if len(spans) > 1 else None


def _blocks_of(part: Any, whole: Any, rank: int | None) -> list[tuple[int, int]]:
    """(dim, start) where `part` is `whole.narrow(dim, start, len)`, in exactly one dimension:
    the rank's own block (start = rank * len) if it is one, and the first other (a constant with
    equal blocks is each of them; both are true, and the rank's own is the one a proof needs)."""
    dim = _narrower_dim(part, whole)
    if dim is None:
        return []
    size = part.shape[dim]
    starts = list(range(whole.shape[dim] - size + 1))
    if rank is not None and rank * size in starts:
        starts.remove(rank * size)
        starts.insert(0, rank * size)
    found: list[tuple[int, int]] = []
    for start in starts:
        if bool((whole.narrow(dim, start, size) == part).all()):
            found.append((dim, start))
            if len(found) == 2 or start != (rank or 0) * size:
                break
    return found
