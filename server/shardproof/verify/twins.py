"""Identities of movement and reduction stated for every node they apply to, mixed into the Encoder
(encode.py): a value is let as the program wrote it and also as the same function written another
way, so that programs which write one computation differently meet in the same terms, and the
rules written for each form apply to both.

- a reduction keeping its dim is the one without it, viewed with the size-1 dim (`_kept_twin`);
- a view of a view is a view of the first view's source (`_view_of_view_twin`);
- a slice of a view along a dim that one dim of the source holds whole (the view keeps it, or
  splits it into parts, one of them sliced) is a view of slices of the source
  (`_slice_of_view_twin`): Megatron's fused QKV output viewed [batch, seq, groups, (heads per group
  + 2) * head_dim] and split per group is, group by group, a slice of the linear's output, which
  the slice-of-concatenation rules read as one projection;
- an elementwise op of an operand viewed with leading size-1 dims is the op of the operand
  without them (`_broadcast_twin`): broadcasting prepends such dims itself, so a bias viewed
  `(1, C, 1, 1)` and one viewed `(C, 1, 1)` add alike;
- a reduction along a dim a view keeps is the view of the source's reduction along it
  (`_reduce_of_view_twin`): logits flattened to [tokens, vocab] for a loss, reduced over the
  vocabulary, are the per-token reductions of the unflattened logits.

Each is a fact of reshape's row-major order, checked on concrete tensors in
tests/unit/test_movement_twins.py and tests/unit/test_kept_reductions.py.
"""

from __future__ import annotations

import math

from ..graph.model import Graph, Node, TensorMeta
from .language import quoted as _q

# the most pieces a slice of a view is written as (one per index of the view's outer dims that
# split the sliced source dim: a rank's query groups); more states no twin
MOST_SLICE_PIECES = 16


def _holding_dim(source: tuple[int, ...], viewed: tuple[int, ...], position: int) -> tuple[int, int] | None:
    """The source dim d that holds the view's dim at `position` whole, and Q': how many of d's
    indices each of the view's dim's indices spans (its elements after it, as a count of d's).

    Row-major, the view's index (p, k, q) (q over the Q elements after the dim, k over its K) is the
    element p * K * Q + k * Q + q. When the source's dims after d hold T elements, T divides Q and
    T <= Q < T * size(d), the view's dim lies within d, each of its indices Q' = Q / T of d's. None
    when the elements after the view's dim do not end at a whole number of d's indices."""
    inner = math.prod(viewed[position + 1 :])
    for d in range(len(source) - 1, -1, -1):
        after = math.prod(source[d + 1 :])
        if inner >= after * source[d]:
            continue  # the elements after the view's dim cover d too: the dim lies further out
        if inner % after:
            return None
        return d, inner // after
    return None


def slice_of_view_pieces(
    source: tuple[int, ...], viewed: tuple[int, ...], dim: int, start: int, end: int
) -> tuple[int, list[tuple[int, int]]] | None:
    """How `source.view(viewed)` sliced along `dim` (negative) over [start, end) is `source`
    sliced along one of its dims: (that dim, negative; the ranges of it, in order, whose
    concatenation viewed with the slice's shape is the slice). None when no source dim holds the
    sliced dim whole (`_holding_dim`).

    With d's size g * K * Q' (g outer indices of the view's dims before the sliced one split d),
    the view's index (p, k, q) is the source's index (p // g, (p % g) * K * Q' + k * Q' + q // T,
    q % T): the slice [start, end) of the view's dim is, for each of the g outer indices, the
    range [start * Q', end * Q') of d shifted by i * K * Q'. Q' = 1 is a split whose inner part is
    sliced (Megatron's per-group split), Q' > 1 a split whose outer part is (`unbind` of a
    [2, heads, head_dim] view)."""
    position = len(viewed) + dim
    size = viewed[position]
    if size <= 1 or not 0 <= start < end <= size or (start, end) == (0, size):
        return None
    held = _holding_dim(source, viewed, position)
    if held is None or size * held[1] > source[held[0]]:  # the dim spans several of the source's
        return _slice_of_merged(source, viewed, position, start, end)
    d, within = held
    block = size * within
    if source[d] % block or source[d] // block > MOST_SLICE_PIECES:
        return None
    pieces = source[d] // block
    return d - len(source), [(i * block + start * within, i * block + end * within) for i in range(pieces)]


def _slice_of_merged(
    source: tuple[int, ...], viewed: tuple[int, ...], position: int, start: int, end: int
) -> tuple[int, list[tuple[int, int]]] | None:
    """The slice [start, end) of a view's dim that merges source dims d..e (their sizes multiply
    to the dim's, the same elements after), when it covers whole indices of d: the slice
    [start / P, end / P) of d, P the product of the merged dims after d (tokens flattened from
    [batch, seq], a rank's rows of whole sequences)."""
    inner = math.prod(viewed[position + 1 :])
    last = next((e for e in range(len(source) - 1, -1, -1) if math.prod(source[e + 1 :]) == inner), None)
    if last is None:
        return None
    for d in range(last, -1, -1):
        merged = math.prod(source[d : last + 1])
        if merged > viewed[position]:
            return None
        if merged == viewed[position]:
            block = merged // source[d]
            if d == last or start % block or end % block:
                return None
            return d - len(source), [(start // block, end // block)]
    return None


def _broadcast(shapes: list[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """The shape operands of these shapes broadcast to (None if they do not)."""
    rank = max(len(shape or ()) for shape in shapes)
    padded = [(1,) * (rank - len(shape or ())) + tuple(shape or ()) for shape in shapes]
    out = []
    for sizes in zip(*padded, strict=True):
        wide = {n for n in sizes if n != 1}
        if len(wide) > 1:
            return None
        out.append(wide.pop() if wide else 1)
    return tuple(out)


class MovementTwins:
    """The twin statements; the Encoder provides `let`, `_view`, `_cat` and `same_as`, and `_view_sources`:
    each term known to be a view of another (a view node, or a slice stated as one) -> that term."""

    def _kept_twin(self, reduced: str, fn: str, source: str, dim: int, keepdim: bool, meta: TensorMeta) -> None:
        """A reduction keeping its dim is the one without it, viewed with a size-1 dim there (and
        the other way round): both are stated, so a program that keeps the dim (`amax(-1,
        keepdim=True)` before a MAX all-reduce) meets one that does not (Megatron's
        `max(dim=-1)[0]`) in the same operations, and the rules of each form apply to both."""
        source_shape = self.meta_of[source].shape
        position = len(source_shape) + dim
        kept = list(source_shape)
        kept[position] = 1
        rows = [*source_shape[:position], *source_shape[position + 1 :]]
        kept_meta, rows_meta = TensorMeta(tuple(kept), meta.dtype), TensorMeta(tuple(rows), meta.dtype)
        if keepdim:
            twin = self.let(self._fresh("unkept"), f"(Red {_q(fn)} {source} {dim} 0)", rows_meta)
            self.commands.append(f"(union {reduced} {self._view(twin, tuple(rows), kept_meta)})")
        else:
            twin = self.let(self._fresh("kept"), f"(Red {_q(fn)} {source} {dim} 1)", kept_meta)
            self.commands.append(f"(union {self._view(reduced, tuple(rows), kept_meta)} {twin})")

    def _reduce_of_view_twin(
        self, reduced: str, fn: str, viewed: str, dim: int, keepdim: bool, meta: TensorMeta
    ) -> None:
        """x.view(s).f(d) is x.f(d').view(..) when d' is a dim of x that the view keeps whole (the
        same size, and the same elements after it): every fiber along d is one along d', in order."""
        source = self._view_sources.get(viewed)
        if source is None or source not in self.meta_of:
            return
        source_shape, shape = self.meta_of[source].shape, self.meta_of[viewed].shape
        position = len(shape) + dim if dim < 0 else dim
        held = _holding_dim(source_shape, shape, position)
        if held is None or held[1] != 1 or source_shape[held[0]] != shape[position] or shape[position] == 1:
            return  # the view splits or merges the dim: its fibers are not the source's
        d = held[0]
        twin_shape = list(source_shape)
        if keepdim:
            twin_shape[d] = 1
        else:
            del twin_shape[d]
        term = f"(Red {_q(fn)} {source} {d - len(source_shape)} {1 if keepdim else 0})"
        twin = self.let(self._fresh("reduced"), term, TensorMeta(tuple(twin_shape), meta.dtype))
        self.commands.append(f"(union {reduced} {self._view(twin, tuple(twin_shape), meta)})")

    def _broadcast_twin(self, name: str, fn: str, operands: list[str], meta: TensorMeta) -> None:
        """Bin(f, a, b.view(1, .., 1, *s)) is Bin(f, a, b.view(*s)) when the result keeps its shape
        (the other operand has the dims): stated for an operand a view made with leading size-1
        dims (written from the view's source)."""
        twins, changed = [], False
        for operand in operands:
            source = self._view_sources.get(operand)
            shape = self.meta_of[operand].shape if operand in self.meta_of else ()
            leading = next((i for i, size in enumerate(shape) if size != 1), len(shape))
            if source is None or source not in self.meta_of or leading == 0 or len(shape) > len(meta.shape):
                twins.append(operand)
                continue
            stripped = TensorMeta(tuple(shape[leading:]), self.meta_of[operand].dtype)
            if stripped.shape == self.meta_of[source].shape:
                twins.append(source)
            else:
                twins.append(self._view(source, self.meta_of[source].shape, stripped))
            changed = True
        shapes = [self.meta_of[t].shape if t in self.meta_of else None for t in twins]
        if changed and None not in shapes and _broadcast(shapes) == tuple(meta.shape):
            self.commands.append(f"(union {name} (Bin {_q(fn)} {twins[0]} {twins[1]}))")

    def _view_of_view_twin(self, name: str, viewed: str, meta: TensorMeta) -> None:
        """x.view(s1).view(s2) is x.view(s2): reshapes only ever read the row-major order. `viewed`
        is the term viewed; a view of a view (or of a slice stated as one) is written from its
        source as well."""
        source = self._view_sources.get(viewed)
        if source is not None and source in self.meta_of:
            self.commands.append(f"(union {name} {self._view(source, self.meta_of[source].shape, meta)})")
        self._view_sources[self.same_as(name)] = source if source is not None and source in self.meta_of else viewed

    def _slice_of_view_twin(self, node: Node, name: str, sliced: str) -> None:
        """x.view(s)[..., a:b, ...] as the view of x's slices (`slice_of_view_pieces`)."""
        source = self._view_sources.get(sliced)
        if source is None or source not in self.meta_of:
            return
        self._slice_of_merged_view_twin(node, name, sliced, source)
        a = node.attrs
        viewed = self.meta_of[sliced].shape
        dim = a["dim"] if a["dim"] < 0 else a["dim"] - len(viewed)
        source_shape = self.meta_of[source].shape
        found = slice_of_view_pieces(source_shape, viewed, dim, a["start"], a["end"])
        if found is None:
            return
        source_dim, ranges = found
        dtype = node.meta.dtype
        parts, shapes = [], []
        for start, end in ranges:
            shape = list(source_shape)
            shape[len(source_shape) + source_dim] = end - start
            shapes.append(tuple(shape))
            term = f"(Slice {source} {source_dim} {start} {end})"
            parts.append(self.let(self._fresh("piece"), term, TensorMeta(tuple(shape), dtype)))
        joined = self._cat(parts, shapes, source_dim, dtype)
        joined_shape = self.meta_of[joined].shape
        self.commands.append(f"(union {name} {self._view(joined, joined_shape, node.meta)})")
        self._view_sources[self.same_as(name)] = joined

    def _slice_of_merged_view_twin(self, node: Node, name: str, sliced: str, source: str) -> None:
        """x.view(S) sliced [a:b] along dim k, the dims after it of I elements, is x.view(S[:k] +
        [prod S[k:]]) sliced [a * I, b * I) along its last dim, viewed with the slice's shape: in
        row-major order the indices a..b of dim k are, under each index of the dims before k, one
        contiguous run of the merged dim. Stated when the merged view is neither the source's shape
        nor the view's: `unbind` of a [.., heads, 3, head_dim] view is then the [.., heads,
        3 * head_dim] view (the one a reference slices per third) sliced. Only for a dim split out of
        one dim of the source with dims after it in that dim (the unit's terms grow by three)."""
        a = node.attrs
        viewed = self.meta_of[sliced].shape
        k = a["dim"] if a["dim"] >= 0 else len(viewed) + a["dim"]
        if not 0 <= k < len(viewed) - 1:
            return  # the last dim: no dims after it to merge
        source_shape = tuple(self.meta_of[source].shape)
        held = _holding_dim(source_shape, viewed, k)
        if held is None or held[1] == 1 or viewed[k] * held[1] > source_shape[held[0]]:
            return  # the dim is not one split out of a single dim of the source, with parts after it
        inner = math.prod(viewed[k + 1 :])
        merged = (*viewed[:k], viewed[k] * inner)
        if merged in (source_shape, tuple(viewed)):
            return
        dtype = node.meta.dtype
        coarse = self._view(source, source_shape, TensorMeta(merged, dtype))
        cut = (*viewed[:k], (a["end"] - a["start"]) * inner)
        term = f"(Slice {coarse} {k - len(merged)} {a['start'] * inner} {a['end'] * inner})"
        piece = self.let(self._fresh("run"), term, TensorMeta(cut, dtype))
        self.commands.append(f"(union {name} {self._view(piece, cut, node.meta)})")

    def state_view_twins(self, graph: Graph) -> None:
        """A value is the view of its twin on unflattened values (capture/leading_dims.py), or
        equal to it when their shapes agree. Twins of values a unit does not hold are skipped."""
        for value, twin in graph.view_twins.items():
            own, other = self.term_of.get((graph.name, value)), self.term_of.get((graph.name, twin))
            if own is None or other is None or own not in self.meta_of or other not in self.meta_of:
                continue
            meta, twin_shape = self.meta_of[own], self.meta_of[other].shape
            viewed = other if twin_shape == meta.shape else self._view(other, twin_shape, meta)
            self.commands.append(f"(union {own} {viewed})")
