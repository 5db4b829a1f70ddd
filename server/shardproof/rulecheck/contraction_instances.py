"""Instances of the contraction rules: linear layers and matmuls cut along their inner, batch or
output dims, grouped and masked attention (see instances.py for what an instance and a near miss
are)."""

from __future__ import annotations

from typing import Any

from .generation import Gen
from .instances import _ATTRS, _scrambled_whole, instance, instance_and_near_miss, near_miss
from .meaning import range_list


# ---------------------------------------------------------------------------------------------
# contractions
# ---------------------------------------------------------------------------------------------
def _linear(g: Gen, features: int | None = None, outputs: int | None = None) -> dict[str, Any]:
    k = features or g.int(4, 8)
    n = outputs or g.int(3, 8)
    return {"X": g.tensor(g.int(1, 2), g.int(2, 3), k), "W": g.tensor(n, k)}


@instance("column-parallel-linear")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    return bindings | {"R": g.selection(bindings["W"].shape[0])}


@instance("row-parallel-linear")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    s, e = g.tile(bindings["X"].shape[-1])
    return bindings | {"s": s, "e": e}


@instance("linear-leading-dim")
def _(g: Gen) -> dict[str, Any]:
    bindings = _linear(g)
    d = g.pick((-2, -3))
    return bindings | {"d": d, "R": g.selection(bindings["X"].shape[d])}


@near_miss("linear-leading-dim")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(3, 6)
    bindings = _linear(g, k, k)
    return bindings | {"d": -1, "R": _scrambled_whole(g, k)}


def _matmul(g: Gen, m: int | None = None, k: int | None = None) -> dict[str, Any]:
    batch = [g.int(2, 3), g.int(2, 4)]
    m, k, n = m or g.int(2, 5), k or g.int(3, 6), g.int(2, 5)
    return {"A": g.tensor(*batch, m, k), "B": g.tensor(*batch, k, n)}


@instance("matmul-batch")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g)
    d = g.pick((-3, -4))
    return bindings | {"d": d, "R": g.selection(bindings["A"].shape[d])}


@near_miss("matmul-batch")
def _(g: Gen) -> dict[str, Any]:
    k = g.int(3, 5)
    return _matmul(g, k, k) | {"d": -2, "R": _scrambled_whole(g, k)}


@instance("matmul-rows")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g)
    return bindings | {"R": g.selection(bindings["A"].shape[-2])}


def _broadcast_matmul(g: Gen, side: str, near: bool) -> dict[str, Any]:
    """A [b1, b2, m, k] @ [k, n] (or [m, k] @ [b1, b2, k, n]), a batch dim of the 4-D operand
    selected; the near miss gives the other operand that dim too, and selects one index of it,
    which then broadcasts back to the whole dim."""
    batch = [g.int(2, 3), g.int(2, 4)]
    m, k, n = g.int(2, 5), g.int(3, 6), g.int(2, 5)
    d = g.pick((-3, -4))
    other_batch = batch if near else []
    if side == "A":
        bindings = {"A": g.tensor(*batch, m, k), "B": g.tensor(*other_batch, k, n)}
    else:
        bindings = {"A": g.tensor(*other_batch, m, k), "B": g.tensor(*batch, k, n)}
    size = batch[len(batch) + 2 + d]
    if near:
        start = g.int(0, size - 1)
        return bindings | {"d": d, "R": range_list([(start, start + 1)])}
    return bindings | {"d": d, "R": g.selection(size)}


instance_and_near_miss("matmul-batch-broadcast-left", lambda g, near: _broadcast_matmul(g, "A", near))
instance_and_near_miss("matmul-batch-broadcast-right", lambda g, near: _broadcast_matmul(g, "B", near))


@instance("matmul-columns")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g)
    return bindings | {"R": g.selection(bindings["B"].shape[-1])}


@instance("matmul-contraction")
def _(g: Gen) -> dict[str, Any]:
    bindings = _matmul(g, k=g.int(4, 7))
    s, e = g.tile(bindings["A"].shape[-1])
    return bindings | {"s": s, "e": e}


def _attention(g: Gen, d: int) -> dict[str, Any]:
    shape = [g.int(1, 3), g.int(2, 5), g.int(3, 5), g.int(2, 4)]
    return {
        "Q": g.tensor(*shape),
        "K": g.tensor(*shape),
        "V": g.tensor(*shape),
        "at": _ATTRS % g.pick(("true", "false")),
        "d": d,
        "R": g.selection(shape[d]),
    }


@instance("attention-heads")
def _(g: Gen) -> dict[str, Any]:
    return _attention(g, g.pick((-3, -4)))


@near_miss("attention-heads")
def _(g: Gen) -> dict[str, Any]:
    bindings = _attention(g, -2)  # a selection of the sequence: each query then sees other keys
    return bindings | {"R": g.selection(bindings["Q"].shape[-2], most=1), "at": _ATTRS % "false"}


def _masked_attention(g: Gen, d: int, broadcast_everywhere: bool = False) -> dict[str, Any]:
    bindings = _attention(g, d)
    batch, _, seq, _ = bindings["Q"].shape
    mask_shape = (1, 1, 1, 1) if broadcast_everywhere else g.pick(((seq, seq), (1, 1, seq, seq), (batch, 1, seq, seq)))
    additive = g.tensor(*mask_shape)  # an additive float mask (a bias on the scores)
    return bindings | {"M": additive, "at": _ATTRS % "false"}


@instance("masked-attention-heads")
def _(g: Gen) -> dict[str, Any]:
    return _masked_attention(g, g.pick((-3, -4)))


@near_miss("masked-attention-heads")
def _(g: Gen) -> dict[str, Any]:
    # a selection of the sequence (under a mask that fits any length): each query then sees fewer keys
    bindings = _masked_attention(g, -2, broadcast_everywhere=True)
    return bindings | {"R": g.selection(bindings["Q"].shape[-2], most=1)}


def _grouped_attention(g: Gen, window: str, off_by_one: bool) -> dict[str, Any]:
    """Query heads [s, e) on a rank, served by a window of one KV head repeated m times (GQA)."""
    kv_heads, m = g.int(2, 3), g.int(2, 4)
    batch, seq, dim = g.int(1, 2), g.int(2, 4), g.int(2, 3)
    heads = kv_heads * m
    n = g.int(1, m)
    lo = g.int(0, kv_heads - 2) * m
    hi = lo + m - n
    s = hi + 1 if off_by_one else g.int(lo, hi)
    repeated = {key: g.tensor(batch, kv_heads, seq, dim).repeat_interleave(m, dim=-3) for key in ("K", "V")}
    other = "V" if window == "K" else "K"
    return {
        "Q": g.tensor(batch, heads, seq, dim),
        **repeated,
        "at": _ATTRS % "true",
        "d": -3,
        "s": s,
        "e": s + n,
        "lo": lo,
        "hi": hi,
        "n": n,
        other.lower(): repeated[other].narrow(-3, s, n),
    }


instance_and_near_miss("attention-key-window", lambda g, off_by_one: _grouped_attention(g, "K", off_by_one))


def _grouped_matmul(g: Gen, window: str, off_by_one: bool) -> dict[str, Any]:
    """Batch slices [s, e) of one operand (query heads on a rank) against a window of the other,
    one slice repeated m times (its KV head); a near miss starts the range past the window, in
    the next group, whose slices differ."""
    groups, m = g.int(2, 3), g.int(2, 4)
    batch, rows, inner, columns = g.int(1, 2), g.int(2, 4), g.int(2, 3), g.int(2, 4)
    n = g.int(1, m)
    lo = g.int(0, groups - 2) * m
    hi = lo + m - n
    s = hi + 1 if off_by_one else g.int(lo, hi)
    left, right = g.tensor(batch, groups * m, rows, inner), g.tensor(batch, groups * m, inner, columns)
    if window == "B":
        right = g.tensor(batch, groups, inner, columns).repeat_interleave(m, dim=-3)
    else:
        left = g.tensor(batch, groups, rows, inner).repeat_interleave(m, dim=-3)
    return {"A": left, "B": right, "d": -3, "s": s, "e": s + n, "lo": lo, "hi": hi, "n": n}


instance_and_near_miss("matmul-batch-window-right", lambda g, off_by_one: _grouped_matmul(g, "B", off_by_one))
instance_and_near_miss("matmul-batch-window-left", lambda g, off_by_one: _grouped_matmul(g, "A", off_by_one))


instance_and_near_miss("attention-value-window", lambda g, off_by_one: _grouped_attention(g, "V", off_by_one))
